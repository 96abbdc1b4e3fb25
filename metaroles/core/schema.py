"""The small value types around messages: chat roles, tool calls, ids and routing keys.

Routing keys are normalised here, once, when a :class:`~metaroles.messages.message.Message` is built:
``cause_by`` from an Action class, instance or string (:func:`any_to_str`), ``send_to`` from
names, Role classes or instances (:func:`to_addresses`).
"""

from __future__ import annotations

import sys
import unicodedata
from collections.abc import Iterable
from enum import StrEnum
from types import ModuleType
from typing import Annotated, Any, ClassVar, cast

from pydantic import AfterValidator, BaseModel, ConfigDict, create_model

from metaroles.core.exceptions import InvalidValueError
from metaroles.core.surface import framework_module

MESSAGE_ROUTE_TO_ALL = "<all>"
"""The ``send_to`` address that reaches every role of an Environment."""

USER_REQUIREMENT = "metaroles.bus.action.UserRequirement"
"""The ``cause_by`` of a message that no Action produced (a user's request)."""

BROADCAST: frozenset[str] = frozenset({MESSAGE_ROUTE_TO_ALL})


class ChatRole(StrEnum):
    """Who speaks in a chat exchange with a model."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


_CHAT_ROLES = frozenset(r.value for r in ChatRole)
_CHAT_ROLE_OF = {r.value: r for r in ChatRole}


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


def checked_name(name: str, *, what: str = "role name") -> str:
    """``name`` if it can name a role: not empty, not the broadcast address, no control or format character.

    A format character (U+202E, a bidi override) would make a terminal show the name, and the lines
    around it, in another order than it is.

    Raises:
        InvalidValueError: Naming the value and what is wrong with it.
    """
    if not isinstance(name, str) or not name.strip():
        raise InvalidValueError(f"{what} {name!r} is empty; give a name")
    if name == MESSAGE_ROUTE_TO_ALL:
        raise InvalidValueError(f"{what} {name!r} is the broadcast address; choose another name")
    odd = next((c for c in name if unicodedata.category(c) in ("Cc", "Cf")), None)
    if odd is not None:
        raise InvalidValueError(
            f"{what} {name!r} holds the control or format character U+{ord(odd):04X}, which changes how a "
            "terminal shows it; remove it"
        )
    return name


RoleName = Annotated[str, AfterValidator(checked_name)]
"""A config field that names a role (:func:`checked_name`)."""


def any_to_str(value: object) -> str:
    """Normalise an Action class, Action instance or string to an action id.

    Args:
        value: A string (kept as is), a class or instance with an ``action_id()`` method, or any other class
            (``module.QualName``, as MetaGPT names it).

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
    if isinstance(value, type):  # MetaGPT's: any class is named by its module and name
        return f"{value.__module__}.{value.__qualname__}"
    raise InvalidValueError(
        f"cause_by={value!r} is not an Action class, an Action instance or a string; "
        "pass the Action that produced the message, e.g. cause_by=WriteCode"
    )


def any_to_name(value: object) -> str:
    """The short name of what :func:`any_to_str` names (MetaGPT's: ``WriteCode`` for ``pkg.actions.WriteCode``)."""
    return any_to_str(value).rpartition(".")[2]


_WATCHES: dict[frozenset[str], frozenset[str]] = {}
"""Every watch set met so far, once: a million roles that watch the same actions share one set."""


def watch_set(ids: Iterable[str]) -> frozenset[str]:
    """``ids`` as a frozen set shared by every role that watches the same actions."""
    key = frozenset(ids)
    return _WATCHES.setdefault(key, key)


def action_ids(actions: object) -> set[str]:
    """Normalise one action or several (classes, instances or ids) to a set of action ids.

    A single string is one id, never its letters: ``watch="pkg.WriteCode"`` watches ``pkg.WriteCode``.

    Raises:
        InvalidValueError: If an item is not an action (see :func:`any_to_str`).
    """
    if isinstance(actions, str | type) or callable(getattr(actions, "action_id", None)):
        return {any_to_str(actions)}
    if isinstance(actions, Iterable) and not isinstance(actions, bytes | dict):
        return {any_to_str(a) for a in actions}
    raise InvalidValueError(
        f"{actions!r} is not an action or a list of them; pass Action classes, instances or ids, e.g. [WriteCode]"
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


def _plain_names(value: object) -> frozenset[str] | None:
    """``value`` as addresses if it is a set, list or tuple of non-empty strings (most ``send_to`` values)."""
    kind = type(value)
    if kind is not frozenset and kind is not set and kind is not list and kind is not tuple:
        return None
    names = cast("Iterable[str]", value)
    for name in names:
        if type(name) is not str or not name:
            return None
    return names if type(names) is frozenset else frozenset(names)


def to_addresses(value: object) -> frozenset[str]:
    """Normalise a ``send_to`` value to a frozen set of addresses.

    Args:
        value: A role name, ``"<all>"``, a Role class or instance, or an iterable of those.

    Returns:
        The addresses as a ``frozenset``.

    Raises:
        InvalidValueError: On any other type, or an empty collection.
    """
    plain = _plain_names(value)
    if plain is not None:
        addresses = plain
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


class UnresolvedContent(BaseModel):
    """``instruct_content`` whose type is not loaded in this process: its fields, kept as data.

    Reading a run directory, a dump or a cassette never imports a module it names (data never runs
    code). A stand-in keeps the fields and the original type's name, so it is written back unchanged;
    import the type's module before loading to get the type itself.
    """

    model_config = ConfigDict(extra="allow")
    type_path: ClassVar[str] = ""
    """The qualified name of the type the data was written from."""
    note: ClassVar[str] = ""
    """Why the type is a stand-in, and how to get the real one."""


_STAND_INS: dict[str, type[UnresolvedContent]] = {}


def _type_path(model: type[BaseModel]) -> str:
    if issubclass(model, UnresolvedContent) and model.type_path:
        return model.type_path
    return f"{model.__module__}.{model.__qualname__}"


def _loaded_model(path: str) -> type[BaseModel] | None:
    """The pydantic class named ``path`` among the modules this process has imported (or metaroles' own)."""
    module_name, _, qualname = path.rpartition(".")
    while module_name:
        module = sys.modules.get(module_name) or framework_module(module_name)
        if module is None:
            module_name, _, head = module_name.rpartition(".")
            qualname = f"{head}.{qualname}"
            continue
        obj: Any = module
        for part in qualname.split("."):
            obj = vars(obj).get(part) if isinstance(obj, type | ModuleType) else None
        if isinstance(obj, type) and issubclass(obj, BaseModel):
            return obj
        return None
    return None


def _stand_in(path: str) -> type[UnresolvedContent]:
    model = _STAND_INS.get(path)
    if model is None:
        note = f"type {path!r} is not loaded in this process; its fields are kept as data (import its module first)"
        model = create_model(path.rpartition(".")[2] or "Content", __base__=UnresolvedContent, __doc__=note)
        model.type_path, model.note = path, note
        _STAND_INS[path] = model
    return model


def encode_instruct_content(model: BaseModel) -> dict[str, Any]:
    """Encode a pydantic instance with its type so that it can be restored from JSON."""
    return {"type": _type_path(type(model)), "value": model.model_dump(mode="json")}


def decode_instruct_content(data: dict[str, Any]) -> BaseModel:
    """Restore a pydantic instance encoded by :func:`encode_instruct_content`.

    The type is looked up among the modules already imported, never imported: the data may come
    from someone else. If it is not loaded (a module not imported here, a class defined inside a
    function) an :class:`UnresolvedContent` stand-in keeps the fields and the type's name.
    """
    path = data.get("type")
    value = data.get("value")
    if path is None and isinstance(data.get("class"), str):  # MetaGPT's form: the class's name and its fields
        path = data["class"]
        value = data.get("value", {k: v for k, v in data.items() if k != "class"})
    if not isinstance(path, str) or not isinstance(value, dict):
        raise InvalidValueError(
            f"instruct_content={data!r} is neither a pydantic model nor an encoded one "
            "({'type': 'pkg.module.Model', 'value': {...}})"
        )
    model = _loaded_model(path)
    if model is None:
        return _stand_in(path).model_validate(value)
    return model.model_validate(value)


def to_chat_role(value: object) -> ChatRole:
    """Normalise a chat role given as a :class:`ChatRole` or its string value.

    Raises:
        InvalidValueError: On anything else (the message lists the chat roles).
    """
    if type(value) is ChatRole:
        return value
    found = _CHAT_ROLE_OF.get(value) if type(value) is str else None  # a dict look-up: the enum's call is slow
    if found is not None:
        return found
    if isinstance(value, str) and value in _CHAT_ROLES:
        return ChatRole(value)
    allowed = ", ".join(repr(r.value) for r in ChatRole)
    raise InvalidValueError(
        f"role={value!r} is not a chat role; use one of {allowed} (a Role's name goes in sent_from)"
    )


def to_instruct_content(value: object) -> BaseModel | None:
    """Accept a pydantic instance, an encoded one (see :func:`encode_instruct_content`) or ``None``."""
    if value is None or isinstance(value, BaseModel):
        return value
    if isinstance(value, dict):
        return decode_instruct_content(value)
    raise InvalidValueError(
        f"instruct_content={value!r} is not a pydantic model; declare an output model "
        "(a pydantic BaseModel) and pass an instance of it"
    )
