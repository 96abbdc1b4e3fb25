"""Actions: what a role does in one step, usually one call to its model.

An Action has a ``name``, an injected ``llm``, ``async run(history)`` and ``aask``. It may
declare a pydantic ``output_model``: the answer is then validated into an instance, which the
role publishes as the message's ``instruct_content``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar, overload
from weakref import WeakKeyDictionary

from pydantic import BaseModel, ValidationError

from metaroles.core.exceptions import InvalidValueError, LLMOutputInvalid, UserError
from metaroles.core.prompts import load_prompt, render_prompt
from metaroles.core.schema import ChatRole
from metaroles.core.surface import Dumped, class_path, declared_fields, jsonable, refuse_undeclared, set_declared
from metaroles.llm.ledger import CostLedger
from metaroles.llm.protocol import LLM, LLMRequest, LLMResponse, parse_output
from metaroles.messages.message import Message

ModelT = TypeVar("ModelT", bound=BaseModel)
_ACTION_OWN = frozenset("name llm instruction output_model desc system_prompt prefix i_context".split())
"""The constructor's own arguments (a subclass that annotates one redeclares it)."""

CONTEXT_MESSAGES = 10
"""How many of the newest history messages the default prompt shows."""


async def complete(
    llm: LLM | None,
    request: LLMRequest,
    *,
    ledger: CostLedger | None,
) -> LLMResponse:
    """Send ``request`` to ``llm`` and account for it in ``ledger``.

    Raises:
        UserError: If ``llm`` is ``None`` (the message says where to pass one).
    """
    if llm is None:
        raise UserError(
            f"action {request.action!r} of role {request.role!r} has no LLM; pass llm=... to the "
            "Role, the Team or the Action (e.g. llm=TestLLM() to run offline)"
        )
    start = time.perf_counter()
    try:
        response = await llm.complete(request)
    except Exception as exc:
        if ledger is not None and ledger.observer is not None:
            ledger.observer.call_failed(llm, request, exc, time.perf_counter() - start)
        raise
    if ledger is not None:
        latency_s = time.perf_counter() - start
        entry = ledger.record(
            role=request.role, action=request.action, response=response, latency_s=latency_s, request=request
        )
        if ledger.observer is not None:
            ledger.observer.call_done(llm, request, response, entry)
    return response


_SCHEMAS: WeakKeyDictionary[type[BaseModel], dict[str, Any]] = WeakKeyDictionary()


def output_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema, a copy each time: pydantic makes it anew on every call; here once per class."""
    schema = _SCHEMAS.get(model)
    if schema is None:
        schema = _SCHEMAS[model] = model.model_json_schema()
    return copy.deepcopy(schema)


async def complete_structured(
    llm: LLM | None,
    request: LLMRequest,
    model: type[ModelT],
    *,
    ledger: CostLedger | None,
    retries: int,
) -> ModelT:
    """Ask for an answer that validates as ``model``, feeding validation errors back up to ``retries`` times.

    Raises:
        LLMOutputInvalid: When no attempt validates; carries the last raw text.
    """
    request = request.model_copy(update={"output_schema": output_schema(model)})
    for attempt in range(retries + 1):
        response = await complete(llm, request, ledger=ledger)
        try:
            return parse_output(response.text, model)
        except (ValidationError, ValueError) as exc:
            errors = str(exc)
            if attempt == retries:
                raise LLMOutputInvalid(
                    f"action {request.action!r} of role {request.role!r}: the answer did not validate as "
                    f"{model.__name__} after {retries + 1} attempts: {errors}",
                    raw=response.text,
                    errors=errors,
                ) from exc
            feedback = [
                {"role": "assistant", "content": response.text},
                {
                    "role": "user",
                    "content": f"That answer is invalid: {errors}\nReply with JSON matching the schema only.",
                },
            ]
            request = request.model_copy(update={"messages": [*request.messages, *feedback]})
    raise AssertionError("unreachable")  # pragma: no cover


class ActionOutput:
    """What an action produced, as MetaGPT's ``ActionOutput``: its text and its structured output, if any."""

    __slots__ = ("content", "instruct_content")

    def __init__(self, content: str, instruct_content: BaseModel | None = None) -> None:
        """Hold ``content`` and ``instruct_content``."""
        self.content = content
        self.instruct_content = instruct_content

    def __repr__(self) -> str:
        """Show the content."""
        return f"ActionOutput(content={self.content!r})"


ActionResult = str | BaseModel | ActionOutput | Message | None
"""What ``Action.run`` may return: text, a validated model, MetaGPT's ActionOutput, a full Message, or nothing."""


class Action(Dumped):
    """One step of a role.

    Subclasses set class attributes and/or override :meth:`run`::

        class WriteHaiku(Action):
            instruction = "Write a haiku about the last message."

    Args:
        name: Display name; defaults to the class attribute ``name``, else the class name.
        llm: The model to ask; a Role passes its own to actions that have none.
        instruction: What the default :meth:`run` asks the model to do.
        output_model: A pydantic model the answer must validate as.
        desc, system_prompt, prefix, i_context: MetaGPT's fields of the same names (``prefix`` is
            otherwise set by the role; ``i_context`` is the action's input, kept for its ``run``).
        context: MetaGPT's shared ``Context`` (its configuration): accepted and not used, since
            collaborators are passed in (give the action ``llm=``, or let its role give its own).
        **fields: The fields a subclass declares with annotations, as MetaGPT's pydantic actions take them.
    """

    name: str = ""
    """Display name (defaults to the class name)."""
    desc: str = ""
    """What the action does, for planners and humans."""
    instruction: str = ""
    """What the default :meth:`run` asks for."""
    output_model: type[BaseModel] | None = None
    """Declared structured output, if any."""
    max_output_retries: int = 2
    """How often an invalid structured answer is retried with the error fed back."""
    system_prompt: str = ""
    """The system message of this action's requests; when empty, its role's prefix (profile, goal, constraints)."""

    cause_by: ClassVar[str] = "metaroles.bus.action.Action"

    i_context: Any = None
    """MetaGPT's input of an action (what its ``run`` works on), when given one."""
    _declared: ClassVar[list[str]] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Compute the subclass's action id and the fields it declares, once."""
        super().__init_subclass__(**kwargs)
        cls.cause_by = f"{cls.__module__}.{cls.__qualname__}"
        cls._declared = [name for name in declared_fields(cls, Action) if name not in _ACTION_OWN]

    def __init__(
        self,
        *,
        name: str | None = None,
        llm: LLM | None = None,
        instruction: str | None = None,
        output_model: type[BaseModel] | None = None,
        desc: str | None = None,
        system_prompt: str | None = None,
        prefix: str = "",
        i_context: Any = None,
        context: object = None,
        **fields: Any,
    ) -> None:
        """Create an action; see the class docstring for the arguments."""
        refuse_undeclared(type(self), fields, self._declared, "action")
        self.name = name or type(self).name or type(self).__name__
        self.llm = llm
        for field, value in (("desc", desc), ("system_prompt", system_prompt), ("i_context", i_context)):
            if value is not None:
                setattr(self, field, value)
        set_declared(self, self._declared, fields)
        if instruction is not None:
            self.instruction = instruction
        if output_model is not None:
            if not (isinstance(output_model, type) and issubclass(output_model, BaseModel)):
                raise InvalidValueError(
                    f"output_model={output_model!r} is not a pydantic model class; pass a BaseModel subclass"
                )
            self.output_model = output_model
        self.role_name = ""
        self.prefix = prefix
        """The role's system prompt (set by the role, see ``Role._get_prefix``)."""
        self.ledger: CostLedger | None = None

    def model_dump(self, *, mode: str = "python", **_: Any) -> dict[str, Any]:
        """The action as data (MetaGPT's pydantic dump): ``Action.model_validate(dump)`` rebuilds its class.

        The model is not part of it: a role gives its own to the actions it rebuilds.
        """
        dump: dict[str, Any] = {"name": self.name, "desc": self.desc, "instruction": self.instruction}
        dump |= {"system_prompt": self.system_prompt, "prefix": self.prefix}
        dump |= {"i_context": jsonable(self.i_context, mode), "cls": class_path(type(self))}
        return dump | {field: jsonable(getattr(self, field), mode) for field in self._declared}

    def set_prefix(self, prefix: str) -> None:
        """Use ``prefix`` as the system message when the action has no ``system_prompt`` of its own (MetaGPT)."""
        self.prefix = prefix

    @classmethod
    def action_id(cls) -> str:
        """The id that messages caused by this action carry in ``cause_by``."""
        return cls.cause_by

    def __repr__(self) -> str:
        """Show the action's name."""
        return f"{type(self).__name__}(name={self.name!r})"

    def build_prompt(self, history: Sequence[Message]) -> str:
        """Render the default prompt: the instruction, then the newest messages."""
        context = "\n".join(str(m) for m in history[-CONTEXT_MESSAGES:]) or "(nothing yet)"
        return render_prompt(
            load_prompt("metaroles.bus.prompts", "action.txt"), instruction=self.instruction, context=context
        )

    async def run(self, history: Sequence[Message]) -> ActionResult:
        """Do the step. The default asks the model with :meth:`build_prompt`."""
        prompt = self.build_prompt(history)
        if self.output_model is not None:
            return await self.aask(prompt, output_model=self.output_model)
        return await self.aask(prompt)

    def _request(self, prompt: str, system_msgs: Sequence[str] | None, max_tokens: int | None = None) -> LLMRequest:
        if system_msgs is None:
            system_msgs = [s for s in (self.system_prompt or self.prefix,) if s]
        messages = [{"role": "system", "content": s} for s in system_msgs]
        messages.append({"role": "user", "content": prompt})
        return LLMRequest(messages=messages, role=self.role_name, action=self.name, max_tokens=max_tokens)

    @overload
    async def aask(
        self, prompt: str, *, system_msgs: Sequence[str] | None = None, max_tokens: int | None = None
    ) -> str: ...

    @overload
    async def aask(
        self,
        prompt: str,
        *,
        system_msgs: Sequence[str] | None = None,
        output_model: type[ModelT],
        max_tokens: int | None = None,
    ) -> ModelT: ...

    async def aask(
        self,
        prompt: str,
        *,
        system_msgs: Sequence[str] | None = None,
        output_model: type[BaseModel] | None = None,
        max_tokens: int | None = None,
    ) -> str | BaseModel:
        """Ask the model; with ``output_model`` get back a validated instance.

        ``max_tokens`` bounds the answer (the model's default otherwise): code needs more than a line of talk.

        Raises:
            UserError: If no LLM was given.
            LLMOutputInvalid: If the structured answer never validates.
        """
        request = self._request(prompt, system_msgs, max_tokens)
        if output_model is None:
            return (await complete(self.llm, request, ledger=self.ledger)).text
        return await complete_structured(
            self.llm, request, output_model, ledger=self.ledger, retries=self.max_output_retries
        )

    async def _aask(self, prompt: str, system_msgs: Sequence[str] | None = None) -> str:
        """MetaGPT's name for :meth:`aask` (text answer; ``system_msgs`` replace the role's prefix)."""
        return await self.aask(prompt, system_msgs=system_msgs)


class UserRequirement(Action):
    """The ``cause_by`` of a user's request: no model produced it."""

    async def run(self, history: Sequence[Message]) -> ActionResult:
        """A user requirement is given, never produced; running it does nothing."""
        return None


def is_action_class(value: object) -> bool:
    """Return whether ``value`` is an Action subclass."""
    return isinstance(value, type) and issubclass(value, Action)


async def run_action(action: Action, history: Sequence[Message], sender: str, send_to: frozenset[str]) -> ActionResult:
    """Run ``action`` on ``history``; an answer that never validated becomes a failure message.

    The failure is published like any response (``metadata["error"]`` says what went wrong and
    keeps the raw text), so the run goes on and the other roles can see it.
    """
    try:
        return await action.run(history)
    except LLMOutputInvalid as exc:
        return failure_message(action, exc, sender, send_to)


def failure_message(action: Action, exc: LLMOutputInvalid, sender: str, send_to: frozenset[str]) -> Message:
    """The message that publishes an answer that never validated (``metadata["error"]`` keeps the raw text)."""
    return Message(
        f"{action.name} failed: {exc}",
        role=ChatRole.ASSISTANT,
        cause_by=action.cause_by,
        sent_from=sender,
        send_to=send_to,
        metadata={"error": {"type": "LLMOutputInvalid", "raw": exc.raw, "errors": exc.errors}},
    )


def result_message(result: ActionResult, action: Action, sender: str, send_to: frozenset[str]) -> Message | None:
    """The message that publishes what ``action`` returned: text, a pydantic model, a Message, or nothing.

    Raises:
        InvalidValueError: If the action returned anything else.
    """
    if isinstance(result, str):
        return Message.trusted(result, None, ChatRole.ASSISTANT, action.cause_by, sender, send_to)
    if isinstance(result, Message):
        return result if result.sent_from else result.model_copy(update={"sent_from": sender})
    if isinstance(result, BaseModel):
        content = result.model_dump_json()
        return Message.trusted(content, result, ChatRole.ASSISTANT, action.cause_by, sender, send_to)
    if isinstance(result, ActionOutput):  # MetaGPT's: its text, and its structured output if any
        structured = result.instruct_content
        return Message.trusted(result.content, structured, ChatRole.ASSISTANT, action.cause_by, sender, send_to)
    if result is None:
        return None
    raise InvalidValueError(
        f"{type(action).__name__}.run returned {result!r} ({type(result).__name__}); "
        "return a str, a pydantic model, an ActionOutput, a Message or None"
    )
