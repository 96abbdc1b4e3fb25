"""MetaGPT's semantics for code ported from MetaGPT, where metaroles' own differ (``docs/porting.md``).

metaroles keeps its native semantics — ``Message.role`` is the chat role a model API needs, a
role's failure stops ``Team.run`` with the run's state saved, dumps name classes by their path —
and ported code that relies on MetaGPT's imports them from here instead::

    from metaroles.compat.metagpt import Environment, Message, Team

- :class:`Message`: ``role`` is a free string, as in MetaGPT (``Message("x", role="Architect").role
  == "Architect"``); its chat role is still ``chat_role``. ``model_dump`` writes ``instruct_content``
  in MetaGPT's form (``{"class", "mapping", "value"}``).
- :class:`Environment`: loads a dump MetaGPT wrote (``roles`` by name, ``member_addrs``,
  ``context``), its history with it; ``model_dump`` names classes with ``__module_class_name``.
- :class:`Action`: ``run`` gets the history as a ``list`` (MetaGPT's ``with_messages: list[Message]``),
  not the read-only view native actions get for free.
- :class:`Team`: ``run`` returns the history, serializes the team when it stops (to ``storage``,
  MetaGPT's ``./workspace/storage/team`` unless given) and, as MetaGPT's ``serialize_decorator``
  does, logs a role's exception instead of raising it: the recover tests rely on it.

Everything else is metaroles' own (``from metaroles import ...``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from metaroles.bus.action import Action as NativeAction
from metaroles.bus.environment import Environment as NativeEnvironment
from metaroles.core.schema import ChatRole
from metaroles.messages.memory import Memory
from metaroles.messages.message import Message as NativeMessage
from metaroles.team.team import Team as NativeTeam

__all__ = ["Action", "Environment", "Message", "Team", "instruct_content_dump"]

logger = logging.getLogger("metaroles.compat.metagpt")

STORAGE = Path("workspace") / "storage" / "team"
"""Where MetaGPT's ``Team.run`` serializes a team (its ``SERDESER_PATH / "team"``), from the working folder."""


def instruct_content_dump(model: BaseModel) -> dict[str, Any]:
    """``model`` in MetaGPT's form: its class's name, each field's type (``mapping``) and its values."""
    mapping = {name: str((field.annotation, ...)) for name, field in type(model).model_fields.items()}
    return {"class": type(model).__name__, "mapping": mapping, "value": model.model_dump(mode="json")}


class Message(NativeMessage):
    """A message whose ``role`` is MetaGPT's free string (a profile such as ``"Architect"``, or a chat role)."""

    __slots__ = ()

    @property  # type: ignore[override]
    def role(self) -> str:
        """The profile the message was given as its role (MetaGPT's), else the chat role's value."""
        profile = (self._metadata or {}).get("profile")
        return str(profile) if profile else str(self._role.value)

    @role.setter
    def role(self, value: object) -> None:
        NativeMessage.role.fset(self, value)  # type: ignore[attr-defined]

    @property
    def chat_role(self) -> ChatRole:
        """The chat role a model API gets (system, user, assistant, tool)."""
        return self._role

    def model_dump(self, *, mode: str = "python", exclude_none: bool = False) -> dict[str, Any]:
        """MetaGPT's dump: the role as given, ``instruct_content`` as ``{"class", "mapping", "value"}``."""
        data = super().model_dump(mode="json" if mode == "json" else "python", exclude_none=exclude_none)
        data["role"] = self.role
        if self.instruct_content is not None:
            data["instruct_content"] = instruct_content_dump(self.instruct_content)
        return data

    def to_dict(self) -> dict[str, Any]:
        """The chat form a model API expects (the chat role, not the profile)."""
        message = super().to_dict()
        message["role"] = self._role.value
        return message

    def __str__(self) -> str:
        """MetaGPT's ``role: content``."""
        return f"{self.role}: {self.content or ''}"


class Action(NativeAction):
    """An action whose ``run`` gets its history as a ``list``, as MetaGPT's ``run(with_messages)`` does."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        run = cls.__dict__.get("run")
        if run is not None:
            cls.run = _listed(run)  # type: ignore[method-assign,assignment]


def _listed(run: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(run)
    async def listed(self: Any, with_messages: Any = None, *args: Any, **kwargs: Any) -> Any:
        if with_messages is not None and not isinstance(with_messages, list | str):
            with_messages = list(with_messages)
        return await run(self, with_messages, *args, **kwargs)

    return listed


class Environment(NativeEnvironment):
    """An environment that loads MetaGPT's dumps and writes its class keys."""

    def __init__(self, **data: Any) -> None:
        """Build it from a MetaGPT dump (``member_addrs`` and ``context`` are MetaGPT's own: not kept)."""
        data.pop("member_addrs", None)
        data.pop("context", None)
        roles = data.get("roles")
        if isinstance(roles, dict):  # MetaGPT's: by name
            roles = list(roles.values())
        if isinstance(roles, list):
            data["roles"] = [_native_role(role) for role in roles]
        history = data.get("history")
        if isinstance(history, dict) and "storage" in history:  # MetaGPT's Memory dump
            data["history"] = Memory.model_validate(history).storage
        super().__init__(**data)

    def model_dump(self, *, mode: str = "python", **extra: Any) -> dict[str, Any]:
        """The dump, its roles naming their classes with MetaGPT's ``__module_class_name``."""
        data = super().model_dump(mode=mode, **extra)
        for role in data["roles"]:
            if "cls" in role:
                role["__module_class_name"] = role.pop("cls")
        return data


def _native_role(role: Any) -> Any:
    """A role's dump with its class under metaroles' key (``cls``)."""
    if isinstance(role, dict) and "__module_class_name" in role and "cls" not in role:
        return {"cls": role["__module_class_name"], **{k: v for k, v in role.items() if k != "__module_class_name"}}
    return role


class Team(NativeTeam):
    """A team whose ``run`` behaves as MetaGPT's: serialized when it stops, a role's exception logged, not raised.

    Args:
        storage: Where ``run`` serializes the team (MetaGPT's ``./workspace/storage/team`` by default).
    """

    def __init__(self, *args: Any, storage: str | Path | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.storage = Path(storage) if storage is not None else STORAGE

    async def run(  # type: ignore[override]
        self, n_round: int = 3, idea: str = "", send_to: object = "", auto_archive: bool = True, **options: Any
    ) -> Memory:
        """Run as MetaGPT's ``Team.run``: the history when it stops; a role's exception is logged, not raised."""
        try:
            await super().run(n_round, idea, send_to, **options)
        except Exception:
            logger.exception("the team stopped on a role's exception; it is serialized in %s", self.storage)
        finally:
            self.serialize(self.storage)
        return self.env.history
