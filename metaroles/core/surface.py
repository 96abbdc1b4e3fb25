"""MetaGPT's pydantic surface for classes that are not pydantic models (Role, Action, Environment, Team).

MetaGPT's Role, Action, Memory, Environment and Team are pydantic ``BaseModel`` s, and code ported
from it dumps and rebuilds them the pydantic way: ``obj.model_dump()``, ``Cls(**data)``,
``Cls.model_validate(data)``, a ``list[SerializeAsAny[Role]]`` field in the user's own model, and
``name: str = Field(default="RoleA")`` as a class default. Ours are plain classes (the bus's hot
path pays no validation); :class:`Dumped` gives them that surface over the one state format they
already have: each class writes :meth:`Dumped.model_dump` (its constructor's arguments and its
saved state) and takes the same keys back in its constructor.

A dump names its class (``"cls"``, or MetaGPT's ``"__module_class_name"``): ``Base.model_validate``
rebuilds the subclass that was dumped, as MetaGPT's polymorphic models do.
"""

from __future__ import annotations

import copy
import importlib
import json
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, ClassVar, Self, TypeVar
from weakref import WeakValueDictionary

from pydantic import GetCoreSchemaHandler
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, SchemaSerializer, core_schema, to_jsonable_python

from metaroles.core.exceptions import InvalidValueError

T = TypeVar("T")

CLASS_KEYS = ("cls", "__module_class_name")
"""The keys a dump names its class under (ours, MetaGPT's)."""

_CLASSES: WeakValueDictionary[str, type] = WeakValueDictionary()
"""Every :class:`Dumped` subclass by its dotted name (a class defined in a function is found too)."""


def _dumped(obj: Dumped, info: core_schema.SerializationInfo) -> dict[str, Any]:
    return obj.model_dump(mode="json" if info.mode_is_json() else "python")


_SERIALIZER = SchemaSerializer(
    core_schema.any_schema(serialization=core_schema.plain_serializer_function_ser_schema(_dumped, info_arg=True))
)
"""How pydantic dumps one wherever it meets it, a ``SerializeAsAny`` field too (it looks this attribute up)."""


def plain_field_defaults(cls: type) -> None:
    """Turn the pydantic ``Field(...)`` class attributes ``cls`` defines into plain class defaults.

    ``name: str = Field(default="RoleA")`` becomes ``"RoleA"``; a ``default_factory`` is kept in
    ``cls._field_factories`` (:func:`fresh_fields` calls it per instance) and the attribute is ``None``.
    """
    factories = dict(getattr(cls, "_field_factories", {}))
    for name, value in list(vars(cls).items()):
        if isinstance(value, FieldInfo):
            if value.default_factory is not None:
                factories[name] = value.default_factory
                setattr(cls, name, None)
            else:
                setattr(cls, name, None if value.default is PydanticUndefined else value.default)
    cls._field_factories = factories  # type: ignore[attr-defined]


def fresh_fields(obj: object, given: Mapping[str, Any]) -> None:
    """Give ``obj`` its own value of each ``Field(default_factory=...)`` class default not in ``given``."""
    for name, factory in getattr(type(obj), "_field_factories", {}).items():
        if name not in given:
            setattr(obj, name, factory())


def refuse_undeclared(cls: type, given: Mapping[str, Any], declared: list[str], kind: str) -> None:
    """Refuse the keywords in ``given`` that ``cls`` does not declare, naming them and how to declare one.

    Raises:
        InvalidValueError: If any.
    """
    unknown = [key for key in given if key not in declared and key not in CLASS_KEYS]
    if unknown:
        raise InvalidValueError(
            f"{cls.__name__} got unknown argument(s) {unknown}; declare them on the class "
            f'(e.g. `{unknown[0]}: str = ""`) to pass them, as a MetaGPT {kind}\'s fields'
        )


def set_declared(obj: object, declared: list[str], given: Mapping[str, Any]) -> None:
    """Give ``obj`` its declared fields: the values ``given``, else its own copy of a mutable class default.

    As pydantic does, a list, dict or set default is copied rather than shared, and a
    ``Field(default_factory=...)`` is called; a value set before (by a subclass) is kept.
    """
    fresh_fields(obj, given)
    for field in declared:
        if field in given:
            setattr(obj, field, given[field])
        elif field not in vars(obj) and isinstance(value := getattr(type(obj), field, None), (list, dict, set)):
            setattr(obj, field, copy.copy(value))


def class_path(cls: type) -> str:
    """``module.QualName``: how a dump names its class."""
    return f"{cls.__module__}.{cls.__qualname__}"


class Dumped:
    """The pydantic surface of a plain class: dump, validate, JSON, and a field type in pydantic models.

    A subclass implements :meth:`model_dump` and accepts every key it writes as a constructor keyword.
    """

    __slots__ = ()
    _field_factories: ClassVar[dict[str, Callable[[], Any]]] = {}
    __pydantic_serializer__: ClassVar[SchemaSerializer] = _SERIALIZER

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Register the class by its name; turn pydantic ``Field(...)`` class defaults into plain defaults."""
        super().__init_subclass__(**kwargs)
        _CLASSES[class_path(cls)] = cls
        plain_field_defaults(cls)

    def model_dump(self, *, mode: str = "python", **_: Any) -> dict[str, Any]:  # pragma: no cover - abstract
        """The object as data: what its constructor takes back (``Cls(**data)``)."""
        raise NotImplementedError

    def model_dump_json(self, *, indent: int | None = None, **_: Any) -> str:
        """:meth:`model_dump` as JSON text."""
        return json.dumps(self.model_dump(mode="json"), indent=indent, ensure_ascii=False)

    @classmethod
    def model_validate(cls, obj: object, **_: Any) -> Self:
        """Rebuild from a dump (the subclass it names), or return an instance as is.

        Raises:
            InvalidValueError: If ``obj`` is neither, or names a class that is not a ``cls`` (or is unknown).
        """
        if isinstance(obj, cls):
            return obj
        if not isinstance(obj, Mapping):
            raise InvalidValueError(f"cannot build a {cls.__name__} from {obj!r}; pass a dict of what model_dump gave")
        target = dumped_class(obj, cls)
        return target(**{key: value for key, value in obj.items() if key not in CLASS_KEYS})

    @classmethod
    def model_validate_json(cls, text: str | bytes, **_: Any) -> Self:
        """Rebuild from the JSON text :meth:`model_dump_json` wrote."""
        return cls.model_validate(json.loads(text))

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        """Let a pydantic model hold one (``SerializeAsAny[Role]`` too): validated and dumped as above."""
        return core_schema.no_info_plain_validator_function(
            cls.model_validate,
            serialization=core_schema.plain_serializer_function_ser_schema(_dumped, info_arg=True),
        )


def dumped_class(data: Mapping[str, Any], base: type[T]) -> type[T]:
    """The class a dump names (``base`` when it names none).

    Raises:
        InvalidValueError: If it names a class that is unknown here or not a ``base``.
    """
    name = next((data[key] for key in CLASS_KEYS if data.get(key)), None)
    if name is None or name == class_path(base):
        return base
    found = _CLASSES.get(name)
    if found is None:
        found = _framework_class(str(name))
    if found is None and str(name).startswith("__main__."):
        raise InvalidValueError(
            f"the dump names class {name!r}, defined in a script run as __main__, which another process cannot "
            "import: move the classes into a module (e.g. my_roles.py), import them in the script, and save again"
        )
    if found is None:
        raise InvalidValueError(
            f"the dump names class {name!r}, which is not defined in this process; import its module first"
        )
    if not issubclass(found, base):
        raise InvalidValueError(f"the dump names class {name!r}, which is not a {base.__name__}")
    return found


def framework_module(module: str) -> ModuleType | None:
    """Module ``module`` if it is one of metaroles' own, imported if need be; ``None`` for any other.

    ``import metaroles`` imports lazily, so a class a dump names may not be loaded yet. Only the
    framework's own modules are imported here (none of them does anything when imported), and none
    whose name has a part beginning with an underscore (``metaroles.__main__`` runs the command):
    any other module a piece of data names is looked up among those loaded, never imported.
    """
    parts = module.split(".")
    if parts[0] != "metaroles" or any(part.startswith("_") or not part.isidentifier() for part in parts):
        return None
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def _framework_class(name: str) -> type | None:
    """A class of metaroles itself that no one has imported yet (see :func:`framework_module`)."""
    module = name
    while "." in module:
        module = module.rpartition(".")[0]
        if framework_module(module) is not None:
            return _CLASSES.get(name)
    return None


def declared_fields(cls: type, base: type) -> list[str]:
    """The fields a subclass of ``base`` declares with annotations (MetaGPT's ``code_text: str = ""``)."""
    names: list[str] = []
    for klass in reversed(cls.__mro__):
        if klass is base or not issubclass(klass, base):
            continue
        for name, annotation in vars(klass).get("__annotations__", {}).items():
            if name.startswith("_") or "ClassVar" in str(annotation) or name in names:
                continue
            names.append(name)
    return names


def jsonable(value: object, mode: str) -> object:
    """``value`` as a dump holds it: JSON data in ``"json"`` mode, else as is."""
    return to_jsonable_python(value) if mode == "json" else value
