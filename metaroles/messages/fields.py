"""Checks and conversions of message fields, and how a pickled message is rebuilt (for ``message``)."""

from __future__ import annotations

import json
import warnings
from itertools import repeat
from json.encoder import encode_basestring
from typing import Any

from metaroles.core.exceptions import InvalidValueError, PortingNote
from metaroles.core.schema import (
    BROADCAST,
    USER_REQUIREMENT,
    ChatRole,
    ToolCall,
    any_to_str,
    to_addresses,
    to_chat_role,
)


def optional_str(field: str, value: object) -> str | None:
    """``value`` if it is a string or ``None``; else an error naming ``field``."""
    if value is None or isinstance(value, str):
        return value
    raise InvalidValueError(f"{field}={value!r} must be a string or None")


def to_tool_calls(value: object) -> list[ToolCall] | None:
    """Tool calls as :class:`ToolCall` objects (dicts shaped like one are validated)."""
    if value is None:
        return None
    if not isinstance(value, list | tuple):
        raise InvalidValueError(f"tool_calls={value!r} must be a list of ToolCall (or of dicts shaped like one)")
    return [c if isinstance(c, ToolCall) else ToolCall.model_validate(c) for c in value]


ROLES = {role.value: role for role in ChatRole}


def profile_as_sender(
    profile: str, sent_from: object, metadata: dict[str, Any] | None
) -> tuple[ChatRole, str, dict[str, Any] | None]:
    """MetaGPT's ``Message(role="Engineer")``: the role's profile, not a chat role — it says who sent it."""
    warnings.warn(
        f"Message(role={profile!r}): {profile!r} is not a chat role; metaroles keeps the sender in sent_from "
        f"(set to {profile!r} unless given) and the chat role 'user'. Write sent_from=... to silence this.",
        PortingNote,
        stacklevel=3,
    )
    if not sent_from or not isinstance(sent_from, str):
        return ChatRole.USER, profile, metadata
    return ChatRole.USER, sent_from, {**(metadata or {}), "profile": profile}


ROLE_VALUES = {role: role.value for role in ChatRole}


def pickled_values(message: Any) -> tuple[Any, ...]:
    """What :func:`unpickled` rebuilds a message from (its class and field values, the chat role as text)."""
    return (
        type(message),
        message.id,
        message.content,
        message.instruct_content,
        ROLE_VALUES[message._role],
        message._cause_by,
        message.sent_from,
        message._send_to,
        message._metadata or None,
        message.tool_calls,
        message.tool_call_id,
        message.name,
        message.base64_image,
    )


def unpickled(cls: Any, *values: Any) -> Any:
    """A message rebuilt from the values :meth:`Message.__reduce__` pickled (they were valid when pickled)."""
    message = cls.__new__(cls)
    (message.id, message.content, message.instruct_content, role, message._cause_by, message.sent_from) = values[:6]
    (message._send_to, metadata, message.tool_calls, message.tool_call_id, message.name, message.base64_image) = values[
        6:
    ]
    message._role = ROLES[role]
    message._metadata = metadata
    return message


_SET_BY_COLUMN = ("id", "content", "_role", "_cause_by", "sent_from", "_send_to")
_NONE = ("instruct_content", "_metadata", "tool_calls", "tool_call_id", "name", "base64_image")


def plain_messages(cls: Any, columns: tuple[list[Any], ...]) -> list[Any]:
    """Messages with only the routing fields, built a field at a time from ``columns`` of equal length.

    The columns are the values of ``id``, ``content``, the chat role (as text), ``cause_by``,
    ``sent_from`` and ``send_to`` (values that were valid when they left); every other field is
    ``None``. Column by column the loops run in C: half the time of :func:`unpickled` per message.
    """
    ids, contents, roles, *rest = columns
    count = len(ids)
    if any(len(column) != count for column in columns):
        raise ValueError(f"columns of {[len(column) for column in columns]} values: a message is one of each")
    new = cls.__new__
    messages = [new(cls) for _ in range(count)]
    values = (ids, contents, map(ROLES.__getitem__, roles), *rest)
    for name, column in zip(_SET_BY_COLUMN, values, strict=True):
        list(map(setattr, messages, repeat(name, count), column))
    for name in _NONE:
        list(map(setattr, messages, repeat(name, count), repeat(None, count)))
    return messages


def get_metadata(message: Any) -> dict[str, Any]:
    """``message.metadata``: the dict is made when first read (most messages never carry any)."""
    metadata: dict[str, Any] | None = message._metadata
    if metadata is None:
        metadata = message._metadata = {}
    return metadata


def set_metadata(message: Any, value: dict[str, Any]) -> None:
    """``message.metadata = value``."""
    message._metadata = value


def set_role(message: Any, value: object) -> None:
    """``message.role = value``, normalised and checked as the constructor does."""
    message._role = to_chat_role(value)


def to_cause_by(value: object) -> str:
    """A ``cause_by`` value as an action id: an Action class or instance becomes its id; none, UserRequirement."""
    return USER_REQUIREMENT if value is None or value == "" else any_to_str(value)


def set_cause_by(message: Any, value: object) -> None:
    """``message.cause_by = value``, normalised as in the constructor."""
    message._cause_by = to_cause_by(value)


def set_send_to(message: Any, value: object) -> None:
    """``message.send_to = value``: a name is one recipient (never its letters), as in the constructor."""
    message._send_to = BROADCAST if value is None else to_addresses(value)


def json_text(message: Any, indent: int | None) -> str:
    """``message``'s JSON: ``json.dumps`` of its fields (``model_dump(mode="json")``, not ASCII-escaped).

    A message without structured content, metadata or tool calls (most of them) is written directly — the very
    same text, five times as fast.
    """
    if (
        indent is not None
        or message.instruct_content is not None
        or message._metadata
        or message.tool_calls is not None
    ):
        return json.dumps(message.model_dump(mode="json"), ensure_ascii=False, indent=indent)
    enc = encode_basestring
    content = "null" if message.content is None else enc(message.content)
    send_to = ", ".join([enc(address) for address in sorted(message._send_to)])
    return (
        f'{{"id": {enc(message.id)}, "content": {content}, "instruct_content": null, '
        f'"role": "{ROLE_VALUES[message._role]}", "cause_by": {enc(message._cause_by)}, '
        f'"sent_from": {enc(message.sent_from)}, "send_to": [{send_to}], "metadata": {{}}, "tool_calls": null, '
        f'"tool_call_id": {_optional_json(message.tool_call_id)}, "name": {_optional_json(message.name)}, '
        f'"base64_image": {_optional_json(message.base64_image)}}}'
    )


def _optional_json(text: str | None) -> str:
    return "null" if text is None else encode_basestring(text)
