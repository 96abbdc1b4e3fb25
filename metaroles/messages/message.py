"""The Message: what roles publish on the bus, and a turn of a chat with a model.

A :class:`Message` carries both the MetaGPT routing fields (``cause_by``, ``sent_from``,
``send_to``, ``instruct_content``) and the OpenManus chat fields (``role``, ``tool_calls``,
``tool_call_id``, ``name``, ``base64_image``). Every field is validated and routing keys are
normalised when the message is built; equality and hashing go by ``id`` only.

It is a slotted class with pydantic's model API (``model_dump``, ``model_dump_json``,
``model_validate``, ``model_validate_json``, ``model_copy``) and a pydantic core schema, so it
can be a field of any pydantic model. It is not a ``BaseModel``: a bus moves many thousands of
messages a second and a slotted object costs a fraction of a model instance to build and hold.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterable
from itertools import repeat
from json.encoder import encode_basestring
from operator import attrgetter
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self

import orjson
import pydantic_core
from pydantic import BaseModel, GetCoreSchemaHandler, GetJsonSchemaHandler, create_model
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from metaroles.core.exceptions import InvalidValueError, PortingNote
from metaroles.core.ids import SCOPE, new_id
from metaroles.core.schema import (
    BROADCAST,
    ChatRole,
    Function,
    ToolCall,
    encode_instruct_content,
    to_addresses,
    to_chat_role,
    to_instruct_content,
)
from metaroles.messages.fields import (
    ROLE_VALUES,
    ROLES,
    ignored_fields,
    optional_str,
    profile_as_sender,
    to_cause_by,
    to_tool_calls,
)

FIELDS = (
    "id",
    "content",
    "instruct_content",
    "role",
    "cause_by",
    "sent_from",
    "send_to",
    "metadata",
    "tool_calls",
    "tool_call_id",
    "name",
    "base64_image",
)
_CHAT_FIELDS = ("tool_calls", "name", "tool_call_id", "base64_image")
_NORMALISED = ("role", "cause_by", "send_to")
"""Fields an assignment normalises as the constructor does (``msg.send_to = "Bob"`` is ``{"Bob"}``)."""
_SLOTS = tuple(f"_{field}" if field in (*_NORMALISED, "metadata") else field for field in FIELDS)


# -- a message rebuilt from its pickled form, or from columns ----------------------------------------------


def unpickled(cls: Any, *values: Any) -> Any:
    """A message rebuilt from the values :meth:`Message.__reduce__` pickled (they were valid when pickled)."""
    message = cls.__new__(cls)
    message._restore(values)
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


def _optional_json(text: str | None) -> str:
    return "null" if text is None else encode_basestring(text)


_FIELD_SET = frozenset(FIELDS)


_LONG_DIGITS = re.compile(rb"\d{19}")
"""Nineteen digits in a row: perhaps an integer past 64 bits, which orjson would read as a float."""


class Message:
    """A message on the bus, and a turn of a chat with a model.

    ``Message("text")`` is a user message with ``cause_by=UserRequirement``, broadcast to every
    role. Every argument is validated; a wrong one raises :class:`InvalidValueError` naming it.

    Args:
        content: Natural-language content (may be given positionally).
        id: Unique id; by default a fresh one (derived from the run's position inside a run, see ``core.ids``).
        instruct_content: Structured content: a pydantic instance (survives JSON with its type).
        role: Chat role: system, user, assistant or tool.
        cause_by: The Action that produced the message: a class, an instance or its id.
        sent_from: Name of the sending role (a role, MetaGPT's ``sent_from=self``, gives its name).
        send_to: Recipients: names, Role classes or instances, ``"<all>"`` (the default).
        metadata: Free-form extra data (JSON-serialisable).
        tool_calls: Tool calls requested by an assistant message.
        tool_call_id: For a tool message: the id of the call it answers.
        name: For a tool message: the tool's name.
        base64_image: An image, base64-encoded.
    """

    __slots__ = _SLOTS
    model_fields: ClassVar[tuple[str, ...]] = FIELDS

    id: str
    content: str | None
    """``None`` only on an assistant message that carries no text (OpenManus' tool-call turns); ``""`` otherwise."""
    instruct_content: BaseModel | None
    _role: ChatRole
    _cause_by: str
    sent_from: str
    _send_to: frozenset[str]
    _metadata: dict[str, Any] | None
    tool_calls: list[ToolCall] | None
    tool_call_id: str | None
    name: str | None
    base64_image: str | None

    def __init__(
        self,
        content: str | None = None,
        *,
        id: str | None = None,
        instruct_content: BaseModel | dict[str, Any] | None = None,
        role: ChatRole | str = ChatRole.USER,
        cause_by: object = None,
        sent_from: str | Any = "",
        send_to: object = None,
        metadata: dict[str, Any] | None = None,
        tool_calls: Iterable[ToolCall | dict[str, Any]] | None = None,
        tool_call_id: str | None = None,
        name: str | None = None,
        base64_image: str | None = None,
        **unknown: object,
    ) -> None:
        """Build a validated message; see the class docstring for the arguments.

        A keyword that is no field is ignored, as MetaGPT's Message ignores it, with a :class:`PortingNote`.
        """
        if unknown:
            ignored_fields(unknown)
        if id is None:
            id = new_id()
        elif not isinstance(id, str) or not id:
            raise InvalidValueError(f"id={id!r} must be a non-empty string (or omitted for a fresh one)")
        if content is None:  # OpenManus: an assistant turn of tool calls only has no text
            content = None if role is ChatRole.ASSISTANT or role == "assistant" else ""
        elif not isinstance(content, str):
            raise InvalidValueError(f"content={content!r} must be a string; put structured data in instruct_content")
        if not isinstance(sent_from, str):
            named = getattr(sent_from, "name", None)  # MetaGPT's roles write sent_from=self: the role's name
            if not isinstance(named, str) or not hasattr(sent_from, "rc"):
                raise InvalidValueError(f"sent_from={sent_from!r} must be the sending role (or its name)")
            sent_from = named
        if metadata is not None and not isinstance(metadata, dict):
            raise InvalidValueError(f"metadata={metadata!r} must be a dict")
        if type(role) is str and role and role not in ROLES:
            role, sent_from, metadata = profile_as_sender(role, sent_from, metadata)
        self.id = id
        self.content = content
        self.instruct_content = None if instruct_content is None else to_instruct_content(instruct_content)
        self._role = role if type(role) is ChatRole else to_chat_role(role)
        self._cause_by = cause_by if type(cause_by) is str and cause_by else to_cause_by(cause_by)
        self.sent_from = sent_from
        self._send_to = BROADCAST if send_to is None else to_addresses(send_to)
        self._metadata = dict(metadata) if metadata else None
        self.tool_calls = None if tool_calls is None else to_tool_calls(tool_calls)
        self.tool_call_id = tool_call_id if tool_call_id is None else optional_str("tool_call_id", tool_call_id)
        self.name = name if name is None else optional_str("name", name)
        self.base64_image = base64_image if base64_image is None else optional_str("base64_image", base64_image)

    @classmethod
    def trusted(
        cls,
        content: str,
        instruct_content: BaseModel | None,
        role: ChatRole,
        cause_by: str,
        sent_from: str,
        send_to: frozenset[str],
    ) -> Self:
        """Build a message from values already normalised, skipping validation (the bus's constructor).

        For the bus's hot path (a Role wrapping its own action's output): ``cause_by`` comes
        from an Action class, ``send_to`` was normalised when the Role was built.
        """
        message = cls.__new__(cls)
        scope = SCOPE.get()  # new_id, inlined: this is the bus's hot path
        message.id = new_id() if scope is None else scope.next()
        message.content = content
        message.instruct_content = instruct_content
        message._role = role
        message._cause_by = cause_by
        message.sent_from = sent_from
        message._send_to = send_to
        message._metadata = None  # made when first read: most messages never carry any (64 B each at a million)
        message.tool_calls = None
        message.tool_call_id = None
        message.name = None
        message.base64_image = None
        return message

    def _restore(self, values: tuple[Any, ...]) -> None:
        """Fill a new message's fields from what :meth:`__reduce__` pickled (they were valid when pickled)."""
        (self.id, self.content, self.instruct_content, role, self._cause_by, self.sent_from) = values[:6]
        (self._send_to, metadata, self.tool_calls, self.tool_call_id, self.name, self.base64_image) = values[6:]
        self._role = ROLES[role]
        self._metadata = metadata

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickle as the field values, the chat role as text (messages cross to shards and back, thousands a round).

        :func:`unpickled` rebuilds it.
        """
        return unpickled, (
            type(self),
            self.id,
            self.content,
            self.instruct_content,
            ROLE_VALUES[self._role],
            self._cause_by,
            self.sent_from,
            self._send_to,
            self._metadata or None,
            self.tool_calls,
            self.tool_call_id,
            self.name,
            self.base64_image,
        )

    # -- fields an assignment normalises ---------------------------------------------------------

    def _get_metadata(self) -> dict[str, Any]:
        """``message.metadata``: the dict is made when first read (most messages never carry any)."""
        metadata = self._metadata
        if metadata is None:
            metadata = self._metadata = {}
        return metadata

    def _set_metadata(self, value: dict[str, Any]) -> None:
        self._metadata = value

    def _set_role(self, value: object) -> None:
        """``message.role = value``, normalised and checked as the constructor does (a profile: the sender)."""
        if type(value) is str and value and value not in ROLES:
            value, self.sent_from, self._metadata = profile_as_sender(value, self.sent_from, self._metadata)
        self._role = to_chat_role(value)

    def _set_cause_by(self, value: object) -> None:
        """``message.cause_by = value``, normalised as in the constructor."""
        self._cause_by = to_cause_by(value)

    def _set_send_to(self, value: object) -> None:
        """``message.send_to = value``: a name is one recipient (never its letters), as in the constructor."""
        self._send_to = BROADCAST if value is None else to_addresses(value)

    # The getters are C-level (``attrgetter``): every delivery reads ``cause_by`` and ``send_to``, and
    # a Python getter there costs the bus ~10 %. The setters normalise as the constructor does.
    if TYPE_CHECKING:

        @property
        def role(self) -> ChatRole:
            """Chat role."""

        @role.setter
        def role(self, value: object) -> None: ...

        @property
        def cause_by(self) -> str:
            """The producing Action's id."""

        @cause_by.setter
        def cause_by(self, value: object) -> None: ...

        @property
        def send_to(self) -> frozenset[str]:
            """Recipients."""

        @send_to.setter
        def send_to(self, value: object) -> None: ...

        metadata: dict[str, Any]

    else:
        role = property(attrgetter("_role"), _set_role, doc="Chat role; an assignment is normalised and checked.")
        cause_by = property(attrgetter("_cause_by"), _set_cause_by, doc="The id of the Action that produced it.")
        send_to = property(attrgetter("_send_to"), _set_send_to, doc="Recipients (``'Bob'`` is ``{'Bob'}``).")
        metadata = property(_get_metadata, _set_metadata, doc="Extra data (JSON-serialisable), made when first read.")

    @property
    def has_metadata(self) -> bool:
        """Whether the message carries any metadata (reading :attr:`metadata` would make an empty dict)."""
        return bool(self._metadata)

    def same_fields(self, other: Message) -> bool:
        """Whether ``other`` carries the very same values in every field (``==`` compares ids only)."""
        return all(getattr(self, field) == getattr(other, field) for field in FIELDS)

    # -- identity and operators ----------------------------------------------------------------

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
        return f"{self.sent_from or self._role.value}: {self.content or ''}"

    def __repr__(self) -> str:
        """Show the routing fields and the content."""
        return (
            f"Message(id={self.id!r}, content={self.content!r}, role={self._role.value!r}, "
            f"cause_by={self.cause_by!r}, sent_from={self.sent_from!r}, send_to={sorted(self.send_to)!r})"
        )

    # -- pydantic's model API ------------------------------------------------------------------

    def model_dump(self, *, mode: Literal["python", "json"] = "python", exclude_none: bool = False) -> dict[str, Any]:
        """Return every field as a dict (``send_to`` sorted, ``instruct_content`` encoded with its type)."""
        metadata = self._metadata
        send_to = self._send_to
        data: dict[str, Any] = {
            "id": self.id,
            "content": self.content,
            "instruct_content": None
            if self.instruct_content is None
            else encode_instruct_content(self.instruct_content),
            "role": ROLE_VALUES[self._role] if mode == "json" else self._role,
            "cause_by": self._cause_by,
            "sent_from": self.sent_from,
            "send_to": [*send_to] if len(send_to) == 1 else sorted(send_to),
            "metadata": {}
            if not metadata
            else pydantic_core.to_jsonable_python(metadata)
            if mode == "json"
            else dict(metadata),
            "tool_calls": None if self.tool_calls is None else [c.model_dump() for c in self.tool_calls],
            "tool_call_id": self.tool_call_id,
            "name": self.name,
            "base64_image": self.base64_image,
        }
        if exclude_none:
            return {k: v for k, v in data.items() if v is not None}
        return data

    def model_dump_json(self, *, indent: int | None = None) -> str:
        """Serialise to JSON; the same message always gives the same text: ``json.dumps`` of its fields.

        (``model_dump(mode="json")``, not ASCII-escaped.) A message without structured content,
        metadata or tool calls (most of them) is written directly — the very same text, five times as fast.
        """
        if indent is not None or self.instruct_content is not None or self._metadata or self.tool_calls is not None:
            return json.dumps(self.model_dump(mode="json"), ensure_ascii=False, indent=indent)
        enc = encode_basestring
        content = "null" if self.content is None else enc(self.content)
        send_to = ", ".join([enc(address) for address in sorted(self._send_to)])
        return (
            f'{{"id": {enc(self.id)}, "content": {content}, "instruct_content": null, '
            f'"role": "{ROLE_VALUES[self._role]}", "cause_by": {enc(self._cause_by)}, '
            f'"sent_from": {enc(self.sent_from)}, "send_to": [{send_to}], "metadata": {{}}, "tool_calls": null, '
            f'"tool_call_id": {_optional_json(self.tool_call_id)}, "name": {_optional_json(self.name)}, '
            f'"base64_image": {_optional_json(self.base64_image)}}}'
        )

    @classmethod
    def model_validate(cls, obj: object) -> Self:
        """Build a message from a dict of fields (or return a message as is).

        Raises:
            InvalidValueError: On an unknown field or a bad value (named).
        """
        if isinstance(obj, cls):
            return obj
        if not isinstance(obj, dict):
            raise InvalidValueError(f"cannot build a Message from {obj!r}; pass a dict of its fields")
        if not obj.keys() <= _FIELD_SET:
            unknown = sorted(set(obj) - _FIELD_SET)
            raise InvalidValueError(f"Message has no field(s) {unknown}; its fields are {list(FIELDS)}")
        return cls(**obj)

    @classmethod
    def model_validate_json(cls, text: str | bytes) -> Self:
        """Build a message from its JSON text (read by orjson; ``NaN`` and an integer beyond 64 bits by ``json``)."""
        raw = text.encode() if isinstance(text, str) else text
        if _LONG_DIGITS.search(raw) is not None:  # orjson reads an integer past 64 bits as a float: json keeps it
            return cls.model_validate(json.loads(raw))
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = json.loads(raw)  # what orjson refuses and Python's json reads (NaN), or its error
        return cls.model_validate(data)

    def model_copy(self, *, update: dict[str, Any] | None = None) -> Self:
        """Return a shallow copy, with ``update`` applied as is (like pydantic, without validation)."""
        clone = type(self).__new__(type(self))
        for field in FIELDS:
            setattr(clone, field, getattr(self, field))
        clone.metadata = dict(self._metadata) if self._metadata else None  # type: ignore[assignment]
        for field, value in (update or {}).items():
            if field not in FIELDS:
                raise InvalidValueError(f"Message has no field {field!r}; its fields are {list(FIELDS)}")
            setattr(clone, field, value)
        return clone

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        """Let pydantic models hold messages: validated by :meth:`model_validate`, dumped by :meth:`model_dump`."""
        return core_schema.no_info_plain_validator_function(
            cls.model_validate,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda message, info: message.model_dump(mode="json" if info.mode_is_json() else "python"),
                info_arg=True,
            ),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """Describe a message as a JSON object with its fields."""
        return {"type": "object", "title": "Message", "properties": {field: {} for field in FIELDS}}

    # -- chat form and factories ---------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Return the chat form a model API expects, omitting fields that are ``None``."""
        message: dict[str, Any] = {"role": self._role.value}
        if self.content is not None:  # OpenManus omits an assistant's absent text
            message["content"] = self.content
        if self.tool_calls is not None:
            message["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        for field in ("name", "tool_call_id", "base64_image"):
            value = getattr(self, field)
            if value is not None:
                message[field] = value
        return message

    def dump(self) -> str:
        """Serialise to JSON (stable: same message, same text)."""
        return self.model_dump_json()

    @classmethod
    def load(cls, text: str | bytes) -> Self | None:
        """Restore a message serialised by :meth:`dump`; ``None`` for text that is not one, as MetaGPT's.

        A :class:`PortingNote` says why; :meth:`model_validate_json` raises instead.
        """
        try:
            return cls.model_validate_json(text)
        except (ValueError, TypeError) as exc:
            warnings.warn(f"Message.load: not a dumped message ({exc}); gave None", PortingNote, stacklevel=2)
            return None

    @classmethod
    def create_instruct_value(cls, kvs: dict[str, Any], class_name: str = "") -> BaseModel:
        """MetaGPT's: a pydantic instance of a model made for ``kvs`` (its fields typed as their values)."""
        fields: dict[str, Any] = {key: (type(value), ...) for key, value in kvs.items()}
        model: type[BaseModel] = create_model(class_name or "InstructValue", **fields)
        return model.model_validate(kvs)

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
        return cls(content, role=ChatRole.ASSISTANT, base64_image=base64_image)

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


class UserMessage(Message):
    """MetaGPT's ``UserMessage(content)``: a message with the chat role ``user``."""

    __slots__ = ()

    def __init__(self, content: str, **kwargs: Any) -> None:
        """Build it; a ``role`` given is replaced, as MetaGPT's does."""
        kwargs.pop("role", None)
        super().__init__(content, role=ChatRole.USER, **kwargs)


class SystemMessage(Message):
    """MetaGPT's ``SystemMessage(content)``: a message with the chat role ``system``."""

    __slots__ = ()

    def __init__(self, content: str, **kwargs: Any) -> None:
        """Build it; a ``role`` given is replaced, as MetaGPT's does."""
        kwargs.pop("role", None)
        super().__init__(content, role=ChatRole.SYSTEM, **kwargs)


class AIMessage(Message):
    """MetaGPT's ``AIMessage(content)``: a message with the chat role ``assistant``."""

    __slots__ = ()

    def __init__(self, content: str, **kwargs: Any) -> None:
        """Build it; a ``role`` given is replaced, as MetaGPT's does."""
        kwargs.pop("role", None)
        super().__init__(content, role=ChatRole.ASSISTANT, **kwargs)


def share_recipients(messages: Iterable[Message], sets: dict[frozenset[str], frozenset[str]]) -> None:
    """Let ``messages`` share one ``send_to`` object per set of recipients (``sets`` keeps them).

    A copy from another process brings its own ``send_to``; a sender writes to the same recipients
    round after round, so one set per sender is kept, not one per message (and the bus's routing,
    which remembers sets by object, meets each once).
    """
    for message in messages:  # the slot itself: the setter would check every address of a set known valid
        send_to = message._send_to
        message._send_to = sets.setdefault(send_to, send_to)
