"""Messages and the small value types around them.

A :class:`Message` carries both the MetaGPT routing fields (``cause_by``, ``sent_from``,
``send_to``, ``instruct_content``) and the OpenManus chat fields (``role``, ``tool_calls``,
``tool_call_id``, ``name``, ``base64_image``). Routing keys are normalised once, when the
message is built; equality and hashing go by ``id`` only.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from enum import StrEnum
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, create_model, field_serializer, field_validator

from metaroles.exceptions import InvalidValueError

MESSAGE_ROUTE_TO_ALL = "<all>"
"""The ``send_to`` address that reaches every role of an Environment."""

USER_REQUIREMENT = "metaroles.action.UserRequirement"
"""The ``cause_by`` of a message that no Action produced (a user's request)."""

BROADCAST: frozenset[str] = frozenset({MESSAGE_ROUTE_TO_ALL})


def new_id() -> str:
    """Return a fresh 128-bit random id as 32 hex digits (fork-safe: read from the OS)."""
    return os.urandom(16).hex()


class ChatRole(StrEnum):
    """Who speaks in a chat exchange with a model."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


_CHAT_ROLES = frozenset(r.value for r in ChatRole)


class ToolChoice(StrEnum):
    """Whether the model may, must or must not call tools."""

    NONE = "none"
    AUTO = "auto"
    REQUIRED = "required"


class AgentState(StrEnum):
    """Execution state of a tool-calling agent."""

    IDLE = "IDLE"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    ERROR = "ERROR"


class Function(BaseModel):
    """The function part of a tool call."""

    name: str
    """Name of the tool to call."""
    arguments: str
    """Arguments as a JSON string, exactly as the model produced them."""


class ToolCall(BaseModel):
    """A tool call requested by the model in an assistant message."""

    id: str
    """Identifier that the answering tool message repeats in ``tool_call_id``."""
    type: str = "function"
    """Kind of call; always ``"function"`` today."""
    function: Function
    """What to call and with which arguments."""


def any_to_str(value: object) -> str:
    """Normalise an Action class, Action instance or string to an action id.

    Args:
        value: A string (kept as is), or a class or instance with an ``action_id()`` method.

    Returns:
        The action id, e.g. ``"mypkg.actions.WriteCode"``.

    Raises:
        InvalidValueError: If ``value`` is none of those.
    """
    if type(value) is str:
        return value
    action_id = getattr(value, "action_id", None)
    if callable(action_id):
        result = action_id()
        if isinstance(result, str):
            return result
    raise InvalidValueError(
        f"cause_by={value!r} is not an Action class, an Action instance or a string; "
        "pass the Action that produced the message, e.g. cause_by=WriteCode"
    )


def _address_of(value: object) -> str:
    if type(value) is str:
        if not value:
            raise InvalidValueError("send_to contains an empty address ''; use a role name or '<all>'")
        return value
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    name = getattr(value, "name", None)
    if isinstance(name, str) and hasattr(value, "addresses"):
        return name
    raise InvalidValueError(
        f"send_to={value!r} ({type(value).__name__}) is not an address; pass a role name, "
        "a Role class or instance, '<all>', or a set of those"
    )


def to_addresses(value: object) -> frozenset[str]:
    """Normalise a ``send_to`` value to a frozen set of addresses.

    Args:
        value: A role name, ``"<all>"``, a Role class or instance, or an iterable of those.

    Returns:
        The addresses as a ``frozenset``.

    Raises:
        InvalidValueError: On any other type, or an empty collection.
    """
    if type(value) is frozenset and all(type(a) is str and a for a in value):
        addresses: frozenset[str] = value
    elif isinstance(value, str | type) or hasattr(value, "addresses"):
        addresses = frozenset((_address_of(value),))
    elif isinstance(value, Iterable) and not isinstance(value, bytes | dict):
        addresses = frozenset(_address_of(item) for item in value)
    else:
        raise InvalidValueError(
            f"send_to={value!r} ({type(value).__name__}) is not an address; pass a role name, "
            "a Role class or instance, '<all>', or a set of those"
        )
    if not addresses:
        raise InvalidValueError("send_to is empty; name at least one role, or use '<all>' to broadcast")
    return addresses


def _type_path(model: type[BaseModel]) -> str:
    return f"{model.__module__}.{model.__qualname__}"


def _import_model(path: str) -> type[BaseModel] | None:
    module_name, _, qualname = path.rpartition(".")
    while module_name:
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError:
            module_name, _, head = module_name.rpartition(".")
            qualname = f"{head}.{qualname}"
            continue
        for part in qualname.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, type) and issubclass(obj, BaseModel):
            return obj
        return None
    return None


def encode_instruct_content(model: BaseModel) -> dict[str, Any]:
    """Encode a pydantic instance with its type so that it can be restored from JSON."""
    return {"type": _type_path(type(model)), "value": model.model_dump(mode="json")}


def decode_instruct_content(data: dict[str, Any]) -> BaseModel:
    """Restore a pydantic instance encoded by :func:`encode_instruct_content`.

    The original class is imported by its qualified name. If it cannot be imported (a class
    defined inside a function, a module not installed here) a stand-in model with the same
    field names is built, so that the data is never lost.
    """
    path = data.get("type")
    value = data.get("value")
    if not isinstance(path, str) or not isinstance(value, dict):
        raise InvalidValueError(
            f"instruct_content={data!r} is neither a pydantic model nor an encoded one "
            "({'type': 'pkg.module.Model', 'value': {...}})"
        )
    model = _import_model(path)
    if model is None:
        fields: dict[str, Any] = {key: (Any, ...) for key in value}
        model = create_model(path.rpartition(".")[2], **fields)
    return model.model_validate(value)


class Message(BaseModel):
    """A message on the bus, and a turn of a chat with a model.

    ``Message("text")`` builds a user message with ``cause_by=UserRequirement`` broadcast to
    every role. Equality and hashing go by ``id``.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, validate_default=False)

    id: str = Field(default_factory=new_id)
    """Unique id (32 hex digits)."""
    content: str = ""
    """Natural-language content."""
    instruct_content: BaseModel | None = None
    """Structured content: a pydantic instance that survives a JSON round trip with its type."""
    role: ChatRole = ChatRole.USER
    """Chat role: system, user, assistant or tool."""
    cause_by: str = USER_REQUIREMENT
    """Id of the Action that produced the message (normalised from a class, instance or string)."""
    sent_from: str = ""
    """Name of the sending role."""
    send_to: frozenset[str] = BROADCAST
    """Addresses of the recipients; ``{"<all>"}`` reaches every role."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Free-form extra data (JSON-serialisable)."""
    tool_calls: list[ToolCall] | None = None
    """Tool calls requested by an assistant message."""
    tool_call_id: str | None = None
    """For a tool message: the id of the call it answers."""
    name: str | None = None
    """For a tool message: the tool's name."""
    base64_image: str | None = None
    """An image, base64-encoded."""

    _CHAT_FIELDS: ClassVar[tuple[str, ...]] = ("tool_calls", "name", "tool_call_id", "base64_image")

    def __init__(self, content: str | None = None, /, **data: Any) -> None:
        """Build a message; ``content`` may be given positionally."""
        if content is not None:
            data["content"] = content
        super().__init__(**data)

    @field_validator("cause_by", mode="before")
    @classmethod
    def _check_cause_by(cls, value: object) -> str:
        if value is None or value == "":
            return USER_REQUIREMENT
        return any_to_str(value)

    @field_validator("send_to", mode="before")
    @classmethod
    def _check_send_to(cls, value: object) -> frozenset[str]:
        return to_addresses(value)

    @field_validator("role", mode="before")
    @classmethod
    def _check_role(cls, value: object) -> ChatRole:
        if isinstance(value, ChatRole):
            return value
        if isinstance(value, str) and value in _CHAT_ROLES:
            return ChatRole(value)
        allowed = ", ".join(repr(r) for r in _CHAT_ROLES)
        raise InvalidValueError(
            f"role={value!r} is not a chat role; use one of {allowed} (a Role's name goes in sent_from)"
        )

    @field_validator("instruct_content", mode="before")
    @classmethod
    def _check_instruct_content(cls, value: object) -> BaseModel | None:
        if value is None or isinstance(value, BaseModel):
            return value
        if isinstance(value, dict):
            return decode_instruct_content(value)
        raise InvalidValueError(
            f"instruct_content={value!r} is not a pydantic model; declare an output model "
            "(a pydantic BaseModel) and pass an instance of it"
        )

    @field_serializer("instruct_content")
    def _dump_instruct_content(self, value: BaseModel | None) -> dict[str, Any] | None:
        return None if value is None else encode_instruct_content(value)

    @field_serializer("send_to")
    def _dump_send_to(self, value: frozenset[str]) -> list[str]:
        return sorted(value)

    def __eq__(self, other: object) -> bool:
        """Messages are equal when their ids are."""
        if isinstance(other, Message):
            return self.id == other.id
        return NotImplemented

    def __hash__(self) -> int:
        """Hash by id, consistent with equality."""
        return hash(self.id)

    def __add__(self, other: object) -> list[Message]:
        """``msg + msg2`` and ``msg + [msgs]`` give a list of messages."""
        if isinstance(other, Message):
            return [self, other]
        if isinstance(other, list):
            return [self, *other]
        raise TypeError(f"cannot add {type(other).__name__} to Message; add a Message or a list of them")

    def __radd__(self, other: object) -> list[Message]:
        """``[msgs] + msg`` gives a list of messages."""
        if isinstance(other, list):
            return [*other, self]
        raise TypeError(f"cannot add Message to {type(other).__name__}; add it to a list of messages")

    def __str__(self) -> str:
        """Render as ``sender: content``."""
        return f"{self.sent_from or self.role.value}: {self.content}"

    def to_dict(self) -> dict[str, Any]:
        """Return the chat form a model API expects, omitting fields that are ``None``."""
        message: dict[str, Any] = {"role": self.role.value, "content": self.content}
        for field in self._CHAT_FIELDS:
            value = getattr(self, field)
            if value is not None:
                message[field] = [c.model_dump() for c in value] if field == "tool_calls" else value
        return message

    def dump(self) -> str:
        """Serialise to JSON (stable: same message, same text)."""
        return self.model_dump_json()

    @classmethod
    def load(cls, text: str | bytes) -> Self:
        """Restore a message serialised by :meth:`dump`."""
        return cls.model_validate_json(text)

    @classmethod
    def user_message(cls, content: str, base64_image: str | None = None) -> Self:
        """Build a user chat message."""
        return cls(content, role=ChatRole.USER, base64_image=base64_image)

    @classmethod
    def system_message(cls, content: str) -> Self:
        """Build a system chat message."""
        return cls(content, role=ChatRole.SYSTEM)

    @classmethod
    def assistant_message(cls, content: str | None = None, base64_image: str | None = None) -> Self:
        """Build an assistant chat message."""
        return cls(content or "", role=ChatRole.ASSISTANT, base64_image=base64_image)

    @classmethod
    def tool_message(cls, content: str, name: str, tool_call_id: str, base64_image: str | None = None) -> Self:
        """Build the message that reports a tool's result for one tool call."""
        return cls(content, role=ChatRole.TOOL, name=name, tool_call_id=tool_call_id, base64_image=base64_image)

    @classmethod
    def from_tool_calls(
        cls, tool_calls: Iterable[Any], content: str = "", base64_image: str | None = None, **kwargs: Any
    ) -> Self:
        """Build an assistant message from raw tool calls (objects with ``id`` and ``function``)."""
        calls = [
            ToolCall(id=call.id, function=Function.model_validate(call.function, from_attributes=True))
            for call in tool_calls
        ]
        return cls(content, role=ChatRole.ASSISTANT, tool_calls=calls, base64_image=base64_image, **kwargs)
