"""Roles: agents on the bus that observe news, think of their next Action, act and publish.

A custom role needs only :meth:`Role.set_actions` and :meth:`Role._watch`, or overrides
:meth:`Role._think` / :meth:`Role._act`. One :meth:`Role.run` is one turn::

    _observe  pop the buffer, remember what is new, keep as news what ``watch`` or the name admits
    react     _think → _act, per react_mode (react / by_order / plan_and_act)
    publish   the last response goes to the Environment
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar
from warnings import warn

if TYPE_CHECKING:
    from metaroles.longterm.storage import MemoryStorage

from metaroles.bus.action import Action, ActionOutput, UserRequirement, failure_message, result_message
from metaroles.bus.context import RoleContext, RoleHost, RoleReactMode, check_react_mode
from metaroles.bus.state import RoleState, context_state, persist_long_term, restore_context
from metaroles.bus.thinking import Step, choose_state, plan_steps, prompt_vars, role_prefix
from metaroles.core.exceptions import InvalidValueError, LLMOutputInvalid
from metaroles.core.ids import IdScope
from metaroles.core.schema import BROADCAST, action_ids, any_to_str, checked_name, to_addresses, watch_set
from metaroles.core.surface import (
    CLASS_KEYS,
    Dumped,
    class_path,
    declared_fields,
    jsonable,
    refuse_undeclared,
    set_declared,
)
from metaroles.llm.ledger import CostLedger
from metaroles.llm.protocol import LLM
from metaroles.longterm.brain import BrainMemory
from metaroles.longterm.memory import LongtermMemory
from metaroles.messages.message import Message

_PLAN, _BY_ORDER = RoleReactMode.PLAN_AND_ACT, RoleReactMode.BY_ORDER
_TURN_HOOKS = ("run", "_observe", "react", "_react", "_think", "_act", "publish_message")
_STATE_KEYS = frozenset(RoleState.model_fields) - {"name", "watch", "long_term"}
"""The keys of a dump (:meth:`Role.model_dump`) that are saved state, loaded after the role is built."""
_OWN = frozenset(
    "name profile goal constraints desc llm actions watch react_mode max_react_loop send_to long_term "
    "similarity_threshold brain_memory recovered states".split()
)
"""The constructor's own arguments: a subclass that annotates one redeclares it, it declares no new field."""


class Role(Dumped):
    """An agent on the bus.

    Class attributes give defaults, so ``class Alice(Role): name = "Alice"`` works as in MetaGPT.

    Args:
        name: Unique name within an Environment (default: class attribute, else class name).
        profile: What the role is, e.g. ``"Engineer"`` (default: the name).
        goal: What it tries to achieve (goes into prompts).
        constraints: Rules it follows (goes into prompts).
        llm: Model for the role and for its actions that have none.
        actions: Action classes or instances; see :meth:`set_actions`.
        watch: Actions whose messages count as news; defaults to ``[UserRequirement]``.
        react_mode: ``"react"``, ``"by_order"`` or ``"plan_and_act"``.
        max_react_loop: How many actions a ``"react"`` turn may take.
        send_to: Where published responses go; defaults to every role (``"<all>"``).
        long_term: A MemoryStorage: watched messages then persist there (a LongtermMemory).
        similarity_threshold: With ``long_term``, drop news this similar to what is remembered.
        brain_memory: A BrainMemory the role's actions may use; saved with the run's state.
        desc: A description (MetaGPT's ``desc``), for humans.
        recovered: Whether the role was rebuilt from a saved state (MetaGPT's flag).
        is_human: A person plays this role (MetaGPT's flag): a run with a person's desk asks them
            (``llm.human``); its model answers when they do not, and when no desk is given.
        **data: What :meth:`model_dump` wrote (its saved state, loaded once the role is built) and the
            fields a subclass declares with annotations (``code_text: str = ""``), as MetaGPT's
            pydantic roles take them: ``Role(**role.model_dump())`` rebuilds the role.
    """

    name: str = ""
    profile: str = ""
    goal: str = ""
    constraints: str = ""
    desc: str = ""
    readings: ClassVar[tuple[str, ...]] = ()
    """Properties a researcher reads of the role, computed from its state (a society agent's ``opinion``):
    an interview's and a panel's ``attributes`` hold them beside the role's own scalar attributes."""
    _default_turn: ClassVar[bool] = True
    _own_observe: ClassVar[bool] = False
    _own_think: ClassVar[bool] = False
    _declared: ClassVar[list[str]] = []
    _class_address: ClassVar[str] = "metaroles.bus.role.Role"
    """``module.QualName`` of the class: every role's second address, one string for all its roles."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Note which hooks of a turn the subclass overrides.

        A checkpoint replays the turns of a class that keeps them all; a turn calls the body of a kept
        ``_observe`` or ``_think`` directly (:meth:`take_news`, :meth:`_next_action`), not through
        a coroutine of its own.
        """
        super().__init_subclass__(**kwargs)
        cls._default_turn = all(getattr(cls, hook) is getattr(Role, hook) for hook in _TURN_HOOKS)
        cls._own_observe, cls._own_think = cls._observe is not Role._observe, cls._think is not Role._think
        cls._declared = [name for name in declared_fields(cls, Role) if name not in _OWN]
        cls._class_address = class_path(cls)

    def __init__(
        self,
        *,
        name: str | None = None,
        profile: str | None = None,
        goal: str | None = None,
        constraints: str | None = None,
        llm: LLM | None = None,
        actions: Sequence[type[Action] | Action] = (),
        watch: Iterable[object] | None = None,
        react_mode: RoleReactMode | str = RoleReactMode.REACT,
        max_react_loop: int = 1,
        send_to: object = None,
        long_term: MemoryStorage | None = None,
        similarity_threshold: float | None = None,
        brain_memory: BrainMemory | None = None,
        desc: str | None = None,
        recovered: bool = False,
        is_human: bool = False,
        **data: Any,
    ) -> None:
        """Create a role; see the class docstring for the arguments."""
        saved = self._take_dump(data) if data else None
        self.name = checked_name(name or type(self).name or type(self).__name__)
        self.profile = profile or type(self).profile or self.name
        self.goal = goal if goal is not None else type(self).goal
        self.constraints = constraints if constraints is not None else type(self).constraints
        self.desc = desc if desc is not None else type(self).desc
        self.recovered = recovered
        self.is_human = bool(is_human)
        self.frozen = False
        """A frozen role hears (its news still enters its memory) but no longer acts: a fork's ``freeze:NAME``."""
        if isinstance(long_term, str):  # a dump's: the id its long-term memory was persisted under
            saved = {**(saved or {}), "long_term": long_term}
            long_term = None
        self.llm = llm
        self.rc = RoleContext(react_mode=check_react_mode(react_mode, max_react_loop), max_react_loop=max_react_loop)
        self.actions: list[Action] = []
        self.states: list[str] = []
        self.send_to = send_to
        self.addresses: frozenset[str] = frozenset({self.name, self._class_address})
        self.ledger: CostLedger | None = None
        self.place = -1
        """The role's place in its Environment (the order of delivery), set when it joins; -1 before."""
        self.ids: IdScope | None = None
        """Where the ids this role makes in its turns come from (set by the Environment it joins)."""
        self.brain_memory = brain_memory
        if long_term is not None:
            self.rc.memory = LongtermMemory(long_term, similarity_threshold=similarity_threshold)
        self._watch([UserRequirement] if watch is None else watch)
        if actions:
            self.set_actions(actions)
        if self._declared or self._field_factories:
            set_declared(self, self._declared, data)
        if saved:
            self.load_state(RoleState(name=self.name, cls=class_path(type(self)), watch=sorted(self.rc.watch), **saved))

    @classmethod
    def _take_dump(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Take out of ``data`` the saved state a dump holds; leave the declared fields; refuse anything else."""
        saved = {key: data.pop(key) for key in _STATE_KEYS & data.keys()}
        saved.pop("cls", None)
        for key in (*CLASS_KEYS[1:], "states", "role_id"):  # derived, or MetaGPT's with no meaning here
            data.pop(key, None)
        refuse_undeclared(cls, data, cls._declared, "role")
        return saved

    def model_dump(self, *, mode: str = "python", **_: Any) -> dict[str, Any]:
        """The role as data (MetaGPT's pydantic dump): its arguments, its declared fields and its saved state.

        ``Role(**dump)`` or ``Role.model_validate(dump)`` (the class the dump names) rebuild it; the
        state part is :meth:`state_dict`'s, the format a run saves.
        """
        rc = self.rc
        dump: dict[str, Any] = {"profile": self.profile, "goal": self.goal, "constraints": self.constraints}
        dump |= {"desc": self.desc, "recovered": self.recovered, "react_mode": rc.react_mode.value}
        dump |= {"is_human": True} if self.is_human else {}
        dump |= {"max_react_loop": rc.max_react_loop, "send_to": sorted(self.send_to), "states": list(self.states)}
        dump["actions"] = [action.model_dump(mode=mode) for action in self.actions]
        dump |= {field: jsonable(getattr(self, field), mode) for field in self._declared}
        return dump | self.state_dict().model_dump(mode=mode)

    def __repr__(self) -> str:
        """Show class and name."""
        return f"{type(self).__name__}(name={self.name!r})"

    @property
    def send_to(self) -> frozenset[str]:
        """Where published responses go; assigning normalises as the constructor does (else ``InvalidValueError``)."""
        return self._send_to

    @send_to.setter
    def send_to(self, value: object) -> None:
        self._send_to = BROADCAST if value is None else to_addresses(value)

    # -- setup ---------------------------------------------------------------------------------

    def set_actions(self, actions: Sequence[type[Action] | Action]) -> None:
        """Give the role its actions (classes are instantiated); resets the stage to -1."""
        instances: list[Action] = []
        for item in actions:
            if isinstance(item, type) and issubclass(item, Action):
                instances.append(item())
            elif isinstance(item, Action):
                instances.append(item)
            elif isinstance(item, dict):  # an action's dump (Action.model_dump), as a role's dump holds them
                instances.append(Action.model_validate(item))
            else:
                raise InvalidValueError(
                    f"set_actions got {item!r}, which is neither an Action class nor an Action instance"
                )
        self.actions = instances
        for action in instances:
            self._bind(action)
        self.states = [sys.intern(f"{i}. {action.name}") for i, action in enumerate(instances)]  # one per cast
        self._set_state(-1)

    def set_action(self, action: type[Action] | Action) -> None:
        """Give the role a single action."""
        self.set_actions([action])

    def _bind(self, action: Action) -> None:
        if action.llm is None:
            action.llm = self.llm
        action.role_name = self.name
        action.ledger = self.ledger
        action.set_prefix(self._get_prefix())

    @property
    def _setting(self) -> str:
        """``name(profile)``, as MetaGPT's logs show a role."""
        return f"{self.name}({self.profile})"

    def _get_prefix(self) -> str:
        """The system prompt of this role's actions: its profile, name, goal and constraints (MetaGPT's prefix)."""
        return role_prefix(self.profile, self.name, self.goal, self.constraints)

    def set_llm(self, llm: LLM) -> None:
        """Use ``llm`` for the role and for its actions that have no model of their own.

        Actions that had inherited the role's previous model follow the change.
        """
        previous, self.llm = self.llm, llm
        for action in self.actions:
            if previous is not None and action.llm is previous:
                action.llm = llm
            self._bind(action)

    def attach(self, env: RoleHost, index: int, *, ids: IdScope | None = None) -> None:
        """Join ``env`` as its ``index``-th role (called by the Environment); ``ids`` is where its turns' ids come from.

        Raises:
            InvalidValueError: If the role already belongs to another environment.
        """
        if self.rc.env is not None and self.rc.env is not env:
            raise InvalidValueError(
                f"role {self.name!r} already belongs to another Environment; build a new role for this one"
            )
        self.rc.env = env
        self.place = index
        self.ids = ids
        self.ledger = env.ledger
        for action in self.actions:
            self._bind(action)

    def _watch(self, actions: Iterable[object]) -> None:
        """Count messages caused by ``actions`` (classes, instances or ids) as news."""
        self.rc.watch = watch_set(action_ids(actions))
        if isinstance(self.rc.memory, LongtermMemory):
            self.rc.memory.watch = set(self.rc.watch)

    def set_addresses(self, addresses: Iterable[str]) -> None:
        """Replace the addresses this role receives on (the Environment re-indexes it)."""
        self.addresses = to_addresses(list(addresses))
        env = self.rc.env
        reindex = getattr(env, "reindex", None)
        if reindex is not None:
            reindex(self)

    def _set_react_mode(self, react_mode: RoleReactMode | str, max_react_loop: int = 1) -> None:
        self.rc.react_mode = check_react_mode(react_mode, max_react_loop)
        self.rc.max_react_loop = max_react_loop

    def set_state(self, state: int) -> None:
        """Go to stage ``state``: its action is the one to do (none outside ``0 .. len(actions) - 1``)."""
        self.rc.state = state
        self.rc.todo = self.actions[state] if 0 <= state < len(self.actions) else None

    _set_state = set_state  # MetaGPT's name

    def set_todo(self, action: Action | None) -> None:
        """Set the action to run next (``None`` for nothing)."""
        self.rc.todo = action

    # -- messages ------------------------------------------------------------------------------

    def put_message(self, message: Message | None) -> None:
        """Buffer ``message`` for the next observation (``None``: nothing, as in MetaGPT)."""
        if message is None:
            return
        if not isinstance(message, Message):
            raise InvalidValueError(f"put_message got {message!r}, which is not a Message; wrap text in Message(...)")
        if self.rc.msg_buffer.push(message) and self.rc.env is not None:
            self.rc.env.mark_ready(self)

    def publish_message(self, message: Message | None) -> None:
        """Hand ``message`` to the Environment (a standalone role's ``run`` returns it instead).

        A message without a sender is signed with this role's name first (as MetaGPT does).
        """
        if message is not None and self.rc.env is not None:
            if not message.sent_from:
                message.sent_from = self.name
            self.rc.env.publish_message(message)

    def _step(self, kind: str, detail: object) -> None:
        """Record a turn step (observe, think, act) in the round's record, if it keeps steps (``bus.record``)."""
        env = self.rc.env
        if env is not None and env.steps is not None:
            env.steps.add(kind, self.name, detail, self.rc.remembered if kind == "observe" else 0)

    async def _observe(self) -> int:
        """Pop the buffer, remember what is new, keep what is watched or addressed as news; count it.

        The news are the buffer's messages ``find_news`` gives (not yet remembered) that ``watch`` or
        the role's name admits (``messages.memory.news_of``), taken in one pass with their adding to
        memory (:meth:`Memory.remember_news`): O(buffered), whatever the memory holds.
        """
        return self.take_news()

    def take_news(self) -> int:
        """:meth:`_observe`'s body: a turn (and a checkpoint's replay) calls it directly when the class keeps it."""
        rc = self.rc
        rc.remembered, rc.news = rc.memory.remember_news(rc.msg_buffer.pop_all(), rc.watch, self.name)
        return len(rc.news)

    def is_watch(self, caused_by: object) -> bool:
        """Whether messages caused by ``caused_by`` (an Action class, instance or id) are news to this role."""
        return any_to_str(caused_by) in self.rc.watch

    async def think(self) -> Action | None:
        """MetaGPT's exported step: observe, then choose the next action (returned; also ``rc.todo``)."""
        await self._observe()
        await self._think()
        return self.rc.todo

    async def act(self) -> ActionOutput:
        """MetaGPT's exported step: run ``rc.todo`` and give its output (content and ``instruct_content``)."""
        message = await self._act()
        if message is None:
            return ActionOutput("")
        return ActionOutput(message.content or "", message.instruct_content)

    @property
    def action_description(self) -> str:
        """What the role does next, for a human: the next action's ``desc``, else its name (else the first one's)."""
        todo = self.rc.todo
        if todo is not None:
            return todo.desc or type(todo).__name__
        return type(self.actions[0]).__name__ if self.actions else ""

    @property
    def is_idle(self) -> bool:
        """True when nothing is buffered, nothing is news and nothing is to do."""
        return not self.rc.news and self.rc.todo is None and self.rc.msg_buffer.empty()

    def get_memories(self, k: int = 0) -> Sequence[Message]:
        """The newest ``k`` remembered messages (all when 0), a read-only view."""
        return self.rc.memory.get(k)

    # -- thinking and acting -------------------------------------------------------------------

    async def _think(self) -> bool:
        """Choose the next action into ``rc.todo``; return whether there is one.

        :meth:`_next_action` decides, unless the model must choose (react mode, several actions).
        """
        chosen = self._next_action()
        if chosen is None:
            self.set_state(await self._choose_state())
            chosen = self.rc.todo is not None
        return chosen

    def _next_action(self) -> bool | None:
        """What :meth:`_think` chooses without the model: the one action, none, by_order's next; else ``None``.

        A turn calls it directly when the class keeps ``_think``.
        """
        rc, count = self.rc, len(self.actions)
        if count == 1:
            rc.state, rc.todo = 0, self.actions[0]
            return True
        if count == 0:
            return False
        if rc.react_mode is _BY_ORDER:
            self.set_state(rc.state + 1)
            return rc.todo is not None
        return None

    def _prompt_vars(self) -> dict[str, str]:
        return prompt_vars(self.name, self.profile, self.goal, self.constraints, self.rc.memory)

    async def _choose_state(self) -> int:
        """Ask the model which action to take next (react mode)."""
        step = Step(self.llm, self.ledger, self.name, self._prompt_vars())
        state = await choose_state(step, self.states, previous=self.rc.state)
        if not -1 <= state < len(self.actions):
            warn(f"role {self.name!r}: the model chose stage {state!r}, out of range; taking none", stacklevel=2)
            return -1
        return state

    async def _plan(self) -> list[int]:
        """Ask the model for the actions to take, in order (plan_and_act mode)."""
        if len(self.actions) == 1:
            return [0]
        step = Step(self.llm, self.ledger, self.name, self._prompt_vars())
        return await plan_steps(step, [a.name for a in self.actions])

    async def _act(self) -> Message | None:
        """Run ``rc.todo`` on the history and remember its response.

        An answer that never validated (``LLMOutputInvalid``) becomes a failure message, published
        like any response (``metadata["error"]`` says what went wrong), so the run goes on.
        """
        rc = self.rc
        todo = rc.todo
        if todo is None:
            return None
        try:
            result = await todo.run(rc.memory.get())
        except LLMOutputInvalid as exc:
            result = failure_message(todo, exc, self.name, self._send_to)
        message = result_message(result, todo, self.name, self._send_to)
        if message is not None:
            rc.memory.add(message)
        return message

    async def _react(self) -> Message | None:
        """Think and act up to ``max_react_loop`` times (by_order: once per action); then nothing is to do."""
        rc, env = self.rc, self.rc.env
        limit = len(self.actions) if rc.react_mode is _BY_ORDER else rc.max_react_loop
        steps = env.steps if env is not None else None
        response: Message | None = None
        kept = not self._own_think
        for _ in range(limit):
            chosen = self._next_action() if kept else None
            if not (await self._think() if chosen is None else chosen):
                break
            if steps is not None:
                steps.add("think", self.name, rc.todo)
            acted = await self._act()
            if steps is not None:
                steps.add("act", self.name, acted)
            response = acted or response
        return response

    async def _plan_and_act(self) -> Message | None:
        """Plan the actions, run them in order; step outputs go to working memory."""
        self.rc.working_memory.clear()
        response: Message | None = None
        for index in await self._plan():
            self._set_state(index)
            self._step("think", self.rc.todo)
            step = await self._act()
            self._step("act", step)
            if step is not None:
                self.rc.working_memory.add(step)
                response = step
        return response

    def react(self) -> Awaitable[Message | None]:
        """Take this turn's actions per ``react_mode`` (await it); the response to publish.

        ``_react`` (react, by_order) or ``_plan_and_act``, handed over rather than awaited here: a turn
        pays no coroutine for the choice. :meth:`run` then puts the stage back to -1 (nothing to do).
        An override may be ``async def react(self)``.
        """
        return self._plan_and_act() if self.rc.react_mode is _PLAN else self._react()

    async def run(self, with_message: Message | str | list[str] | None = None) -> Message | None:
        """One turn: ``_observe``, then ``react`` (``_think`` → ``_act``), then publish. Returns the response, if any.

        Every role takes its turns here, a default one as a custom one.
        """
        if with_message is not None:
            if isinstance(with_message, list):  # MetaGPT's: a list of strings is one message, a line each
                with_message = "\n".join(with_message)
            self.put_message(Message(with_message) if isinstance(with_message, str) else with_message)
        observed = await self._observe() if self._own_observe else self.take_news()
        rc = self.rc
        env = rc.env
        if env is not None and env.steps is not None:
            env.steps.add("observe", self.name, rc.news, rc.remembered)
        if not observed or self.frozen:
            return None
        response = await self.react()
        rc.state, rc.todo = -1, None
        self.publish_message(response)
        return response

    @property
    def default_turn(self) -> bool:
        """Whether a turn is the default one (observe, run the one action, publish): a checkpoint then replays it."""
        rc = self.rc
        return self._default_turn and len(self.actions) <= 1 and rc.max_react_loop == 1 and rc.react_mode is not _PLAN

    # -- state ---------------------------------------------------------------------------------

    def state_dict(self) -> RoleState:
        """Everything needed to resume this role, buffered messages included."""
        return RoleState(
            name=self.name,
            cls=f"{type(self).__module__}.{type(self).__qualname__}",
            addresses=sorted(self.addresses),
            **context_state(self.rc),
            long_term=persist_long_term(self.rc.memory, self.name),
            brain=self.brain_memory,
            extra=self.extra_state(),
        )

    def extra_state(self) -> dict[str, Any] | None:
        """State a subclass keeps beyond the bus's, as JSON data, saved with the role (``None``: none)."""
        return None

    @property
    def keeps_extra_state(self) -> bool:
        """Whether :meth:`extra_state` may hold something now: a class that overrides it, unless it says otherwise.

        A checkpoint writes such a role whole each time; a role that keeps none yet (a user of a million
        whose memory has not been folded) says so here and is checkpointed as a plain one.
        """
        return type(self).extra_state is not Role.extra_state

    def load_extra_state(self, data: dict[str, Any]) -> None:
        """Restore what :meth:`extra_state` returned."""

    def load_state(self, state: RoleState) -> None:
        """Restore a state produced by :meth:`state_dict` (the role keeps its actions and model)."""
        if state.name != self.name:
            raise InvalidValueError(f"state of role {state.name!r} cannot be loaded into role {self.name!r}")
        restore_context(self.rc, state)
        self.addresses = frozenset(state.addresses)
        if state.brain is not None:
            self.brain_memory = state.brain
        if state.extra is not None:
            self.load_extra_state(state.extra)
        self._set_state(state.state)


class HumanRole(Role):
    """A role a person plays (MetaGPT's ``is_human=True``): asked wherever its model is a ``HumanLLM``.

    A :class:`~metaroles.llm.human.HumanLLM` (``metaroles run --human NAME``) asks the person at the
    terminal or on the watch page; with none, its model answers (with a warning when it is hired).
    """

    def __init__(self, **kwargs: Any) -> None:
        """Create the role as :class:`Role` does, played by a person."""
        kwargs.setdefault("is_human", True)
        super().__init__(**kwargs)
