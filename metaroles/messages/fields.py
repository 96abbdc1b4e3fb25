"""Checks and conversions of message field values (the constructor's and the setters' of ``message``)."""

from __future__ import annotations

import warnings
from typing import Any

from metaroles.core.exceptions import InvalidValueError, PortingNote
from metaroles.core.schema import (
    USER_REQUIREMENT,
    ChatRole,
    ToolCall,
    any_to_str,
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
    """MetaGPT's ``Message(role="Engineer")``: the role's profile, not a chat role — kept in ``metadata["profile"]``.

    The chat role is ``user``; ``sent_from`` stays as given, so the role that publishes the message
    signs it with its name (``Memory.get_by_role("Engineer")`` still finds it by the profile).
    """
    warnings.warn(
        f"Message(role={profile!r}): {profile!r} is not a chat role; metaroles keeps it in metadata['profile'] "
        f"(get_by_role({profile!r}) finds it), the chat role 'user', and the publishing role signs sent_from. "
        "Write sent_from=... or metadata={'profile': ...} to silence this.",
        PortingNote,
        stacklevel=3,
    )
    return ChatRole.USER, sent_from if isinstance(sent_from, str) else "", {**(metadata or {}), "profile": profile}


ROLE_VALUES = {role: role.value for role in ChatRole}


def ignored_fields(unknown: dict[str, object]) -> None:
    """MetaGPT's ``Message(content="a", x="d")``: a keyword that is no field is ignored, and said so once."""
    warnings.warn(
        f"Message got {sorted(unknown)}, which are no fields of a Message; ignored, as MetaGPT's Message does. "
        "Put extra data in metadata={...} to keep it.",
        PortingNote,
        stacklevel=3,
    )


def to_cause_by(value: object) -> str:
    """A ``cause_by`` value as an action id: an Action class or instance becomes its id; none, UserRequirement."""
    return USER_REQUIREMENT if value is None or value == "" else any_to_str(value)
