"""Checks and conversions of message fields, and how a pickled message is rebuilt (for ``message``)."""

from __future__ import annotations

import warnings
from typing import Any

from metaroles.core.exceptions import InvalidValueError, PortingNote
from metaroles.core.schema import ChatRole, ToolCall


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


def unpickled(cls: Any, *values: Any) -> Any:
    """A message rebuilt from the values :meth:`Message.__reduce__` pickled (they were valid when pickled)."""
    message = cls.__new__(cls)
    (message.id, message.content, message.instruct_content, role, message._cause_by, message.sent_from) = values[:6]
    (message._send_to, metadata, message.tool_calls, message.tool_call_id, message.name, message.base64_image) = values[
        6:
    ]
    message._role = ROLES[role]
    message.metadata = {} if metadata is None else metadata
    return message
