"""Tool-calling agents (the OpenManus agent layer): BaseAgent, ReActAgent, ToolCallAgent.

States: IDLE → RUNNING (``run``) → FINISHED (a special tool such as ``terminate``, or the step
budget is spent) or ERROR (an exception; re-raised). Unlike OpenManus, whose ``state_context``
restores the previous state in ``finally``, FINISHED and ERROR stand after ``run`` returns;
``reset()`` goes back to IDLE, and ``run`` refuses to start from any other state.

Other OpenManus defects fixed here: each agent has its own model (token counts do not mix);
the chat window never starts with a tool message whose call fell out of it; stuck detection
compares whole assistant answers (text and tool calls), and its prompt is added once; tool-call
ids are unique per agent even when a model repeats them; NONE-mode tool calls are ignored with a
warning; REQUIRED mode without calls raises :class:`ToolCallMissing` (the run ends in ERROR).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any
from warnings import warn

from metaroles.agents.tool import BaseTool, Terminate, ToolCollection
from metaroles.bus.action import complete
from metaroles.core.exceptions import AgentStateError, InvalidValueError, RunError, ToolCallMissing
from metaroles.core.prompts import load_prompt, render_prompt
from metaroles.core.schema import AgentState, ChatRole, ToolCall, ToolChoice, to_chat_role
from metaroles.core.surface import fresh_fields, plain_field_defaults
from metaroles.llm.ledger import CostLedger
from metaroles.llm.protocol import LLM, LLMRequest, parse_json
from metaroles.messages.memory import ChatMemory
from metaroles.messages.message import Message

AgentEvent = Callable[[str, dict[str, Any]], None]
"""Receives ``("tool_call" | "tool_result", fields)`` as an agent works (the bus logs them)."""


class BaseAgent(ABC):
    """An agent that runs ``step`` until it finishes or spends ``max_steps``.

    Args:
        name: The agent's name (a role's name when it sits on the bus).
        llm: Its own model.
        description: What it does.
        system_prompt: Sent first in every request.
        next_step_prompt: Added as a user message before each step's request.
        max_steps: Step budget of one ``run``.
        max_messages: Size of the chat window (:class:`ChatMemory`).
        duplicate_threshold: How many earlier identical answers make the agent stuck.
        ledger: Where its model calls are accounted (a role passes the run's ledger).
    """

    name: str = ""
    description: str = ""
    system_prompt: str | None = None
    next_step_prompt: str | None = None
    max_steps: int = 10
    max_messages: int = 100
    duplicate_threshold: int = 2

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Class attributes are defaults, as OpenManus' pydantic fields (``Field(...)`` ones too)."""
        super().__init_subclass__(**kwargs)
        plain_field_defaults(cls)

    def __init__(
        self,
        *,
        name: str | None = None,
        llm: LLM | None = None,
        description: str | None = None,
        system_prompt: str | None = None,
        next_step_prompt: str | None = None,
        max_steps: int | None = None,
        max_messages: int | None = None,
        duplicate_threshold: int | None = None,
        ledger: CostLedger | None = None,
    ) -> None:
        """Create an IDLE agent; see the class docstring (an argument not given: the class attribute)."""
        cls = type(self)
        fresh_fields(self, {})
        name = name or cls.name or cls.__name__
        max_steps = cls.max_steps if max_steps is None else max_steps
        duplicate_threshold = cls.duplicate_threshold if duplicate_threshold is None else duplicate_threshold
        if not isinstance(name, str):
            raise InvalidValueError(f"name={name!r} must be a non-empty string, e.g. name='coder'")
        for label, value in (("max_steps", max_steps), ("duplicate_threshold", duplicate_threshold)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidValueError(f"{label}={value!r} must be a positive integer")
        self.name = name
        self.llm = llm if llm is not None else getattr(self, "llm", None)
        """Its model; without one, a step says to pass ``llm=`` (OpenManus builds one from its global config)."""
        self.description = cls.description if description is None else description
        self.system_prompt = cls.system_prompt if system_prompt is None else system_prompt
        self.next_step_prompt = cls.next_step_prompt if next_step_prompt is None else next_step_prompt
        self.max_steps = max_steps
        self.duplicate_threshold = duplicate_threshold
        self.memory = ChatMemory(max_messages=cls.max_messages if max_messages is None else max_messages)
        self.ledger = ledger
        self.state = AgentState.IDLE
        self.current_step = 0
        self.stop_reason = ""
        """Why the last run ended: ``finished`` or ``max_steps`` (empty before any run)."""

    @classmethod
    def action_id(cls) -> str:
        """The ``cause_by`` of what this kind of agent publishes on the bus."""
        return f"{cls.__module__}.{cls.__qualname__}"

    @property
    def messages(self) -> list[Message]:
        """The chat window, oldest first."""
        return self.memory.messages

    @messages.setter
    def messages(self, value: Iterable[Message]) -> None:
        self.memory.messages = list(value)  # ``agent.messages += [...]`` hands back the live list, extended

    @property
    def finished(self) -> bool:
        """Whether the agent is FINISHED (a step may set it mid-run)."""
        return self.state is AgentState.FINISHED

    @asynccontextmanager
    async def state_context(self, new_state: AgentState) -> AsyncIterator[None]:
        """Enter ``new_state``; on an exception go to ERROR and re-raise. No state is restored after.

        Raises:
            InvalidValueError: If ``new_state`` is not an AgentState.
        """
        if not isinstance(new_state, AgentState):
            raise InvalidValueError(f"state {new_state!r} is not an AgentState; use one of {list(AgentState)}")
        self.state = new_state
        try:
            yield
        except BaseException:
            self.state = AgentState.ERROR
            raise

    def update_memory(self, role: ChatRole | str, content: str, base64_image: str | None = None, **kwargs: Any) -> None:
        """Add a message made by the factory that fits ``role`` (a tool message needs ``name`` and ``tool_call_id``).

        Raises:
            InvalidValueError: On an unknown role, or a tool message without ``name``/``tool_call_id``.
        """
        chat_role = to_chat_role(role)
        if chat_role is ChatRole.TOOL:
            if "name" not in kwargs or "tool_call_id" not in kwargs:
                raise InvalidValueError("a tool message needs name=... and tool_call_id=... (the call it answers)")
            message = Message.tool_message(content, kwargs["name"], kwargs["tool_call_id"], base64_image)
        elif chat_role is ChatRole.USER:
            message = Message.user_message(content, base64_image)
        elif chat_role is ChatRole.SYSTEM:
            message = Message.system_message(content)
        else:
            message = Message.assistant_message(content, base64_image)
        self.memory.add_message(message)

    async def run(self, request: str | None = None) -> str:
        """Take ``request`` (if any) and step until FINISHED or ``max_steps``; return the steps' results.

        Raises:
            AgentStateError: If the agent is not IDLE (call :meth:`reset`).
        """
        if self.state is not AgentState.IDLE:
            raise AgentStateError(
                f"agent {self.name!r} is {self.state.value}; run() starts only from IDLE: call reset() first"
            )
        if request is not None:
            self.update_memory(ChatRole.USER, request)
        results: list[str] = []
        async with self.state_context(AgentState.RUNNING):
            while self.current_step < self.max_steps and not self.finished:
                self.current_step += 1
                result = await self.step()
                if self.is_stuck():
                    self.handle_stuck_state()
                results.append(f"Step {self.current_step}: {result}")
            self.stop_reason = "finished" if self.finished else "max_steps"
            if self.stop_reason == "max_steps":
                results.append(f"terminated: reached max steps ({self.max_steps})")
            self.state = AgentState.FINISHED
        return "\n".join(results) or "No steps executed"

    def reset(self, *, clear_memory: bool = False) -> None:
        """Back to IDLE with the step counter at 0 (the chat is kept unless ``clear_memory``)."""
        self.state = AgentState.IDLE
        self.current_step = 0
        if clear_memory:
            self.memory.clear()

    @abstractmethod
    async def step(self) -> str:
        """One step; returns what it did."""

    def is_stuck(self) -> bool:
        """Whether the latest assistant answer repeats ``duplicate_threshold`` earlier ones."""
        answers = [_answer(m) for m in self.memory.messages if m.role is ChatRole.ASSISTANT]
        if not answers or answers[-1] == ("", ()):
            return False
        return answers[:-1].count(answers[-1]) >= self.duplicate_threshold

    def handle_stuck_state(self) -> None:
        """Put the change-of-strategy prompt before the next step's prompt (once)."""
        stuck = load_prompt("metaroles.agents.prompts", "stuck.txt").strip()
        if stuck not in (self.next_step_prompt or ""):
            self.next_step_prompt = f"{stuck}\n{self.next_step_prompt or ''}".strip()


def _answer(message: Message) -> tuple[str, tuple[tuple[str, str], ...]]:
    calls = tuple((c.function.name, c.function.arguments) for c in message.tool_calls or ())
    return (message.content or "", calls)


class ReActAgent(BaseAgent):
    """An agent whose step is ``think`` (decide) then ``act`` (do)."""

    @abstractmethod
    async def think(self) -> bool:
        """Decide the next action; return whether there is one."""

    @abstractmethod
    async def act(self) -> str:
        """Do the decided action; return what happened."""

    async def step(self) -> str:
        """Think, then act if there is something to do."""
        if not await self.think():
            return "Thinking complete - no action needed"
        return await self.act()


class NoToolCall(UserWarning):
    """An agent's model called no tool in a whole run (it answered in plain text)."""


class ToolCallAgent(ReActAgent):
    """A ReAct agent whose actions are tool calls the model chooses.

    As in OpenManus, a subclass may declare its configuration as class attributes (``available_tools``,
    ``system_prompt``, ``next_step_prompt``, ``max_steps``, ``tool_choices``, ``special_tool_names``,
    ``max_observe``, ``name``); an argument given to the constructor wins.

    Args:
        tools: Its tools (default: ``Terminate`` only).
        tool_choice: NONE (answer in text), AUTO (the model decides) or REQUIRED (must call).
        special_tool_names: Tools whose call finishes the run.
        max_observe: Truncate each tool observation to this many characters.
        on_event: Told of each tool call and result (an AgentRole logs them on the bus).
        **options: See :class:`BaseAgent`.
    """

    available_tools: ToolCollection = None  # type: ignore[assignment]  # a subclass may declare its tools here
    tool_choices: ToolChoice = ToolChoice.AUTO
    special_tool_names: Iterable[str] = (Terminate.NAME,)
    max_observe: int | None = None

    def __init__(
        self,
        *,
        tools: ToolCollection | Iterable[BaseTool] | None = None,
        tool_choice: ToolChoice | str | None = None,
        special_tool_names: Iterable[str] | None = None,
        max_observe: int | None = None,
        on_event: AgentEvent | None = None,
        **options: Any,
    ) -> None:
        """Create an IDLE tool-calling agent; see the class docstring for the arguments."""
        cls = type(self)
        tool_choice = cls.tool_choices if tool_choice is None else tool_choice
        max_observe = cls.max_observe if max_observe is None else max_observe
        if tool_choice not in set(ToolChoice):
            raise InvalidValueError(f"tool_choice={tool_choice!r} must be one of {[c.value for c in ToolChoice]}")
        if max_observe is not None and (
            isinstance(max_observe, bool) or not isinstance(max_observe, int) or max_observe < 1
        ):
            raise InvalidValueError(f"max_observe={max_observe!r} must be a positive integer or None")
        if cls.next_step_prompt is None:
            options.setdefault(
                "next_step_prompt", load_prompt("metaroles.agents.prompts", "toolcall_next_step.txt").strip()
            )
        super().__init__(**options)
        if self.system_prompt is None:
            self.system_prompt = render_prompt(
                load_prompt("metaroles.agents.prompts", "toolcall_system.txt"), name=self.name
            )
        tools = self.available_tools if tools is None else tools  # a class's (OpenManus declares them there)
        self.available_tools = (
            tools if isinstance(tools, ToolCollection) else ToolCollection(*(tools or (Terminate(),)))
        )
        self.tool_choices = ToolChoice(tool_choice)
        names = cls.special_tool_names if special_tool_names is None else special_tool_names
        self.special_tool_names = [n.lower() for n in names]
        self.max_observe = max_observe
        self.on_event = on_event
        self.tool_calls: list[ToolCall] = []
        self.call_ids: set[str] = set()
        """The ids of the tool calls made so far (a repeated or missing id is renamed: each result is its own)."""

    async def run(self, request: str | None = None) -> str:
        """Step as :meth:`BaseAgent.run` does; a run in which the model called no tool at all is said, in a line.

        A small model (the embedded default) often answers in plain text, ``terminate`` written out
        and never called: the run then ends at ``max_steps`` having done nothing, which a
        :class:`NoToolCall` warning says instead of leaving it to be found.
        """
        before = len(self.call_ids)
        result = await super().run(request)
        if len(self.call_ids) == before and self.current_step and self.tool_choices is not ToolChoice.NONE:
            model = getattr(self.llm, "model", None) or type(self.llm).__name__
            warn(
                NoToolCall(
                    f"agent {self.name!r}: its model {model!r} called no tool in {self.current_step} step(s), "
                    "answering in plain text; tools need a model that calls them (README: which models call tools)"
                ),
                stacklevel=2,
            )
        return result

    # -- think -----------------------------------------------------------------------------------

    async def think(self) -> bool:
        """Ask the model with the tools and ``tool_choice``; remember its answer; return whether to act."""
        if self.next_step_prompt:
            self.memory.add_message(Message.user_message(self.next_step_prompt))
        request = LLMRequest(
            messages=self._chat(),
            tools=self.available_tools.to_params(),
            tool_choice=self.tool_choices.value,
            role=self.name,
            action="think",
        )
        response = await complete(self.llm, request, ledger=self.ledger)
        calls = self._unique_ids(response.tool_calls or [])
        content = response.text or ""
        if self.tool_choices is ToolChoice.NONE:
            if calls:
                warn(
                    f"agent {self.name!r} called {[c.function.name for c in calls]} under tool_choice=none; ignored",
                    stacklevel=2,
                )
            self.tool_calls = []
            if content:
                self.memory.add_message(Message.assistant_message(content))
                return True
            return False
        self.tool_calls = calls
        answer = Message.from_tool_calls(calls, content) if calls else Message.assistant_message(content)
        self.memory.add_message(answer)
        if self.tool_choices is ToolChoice.REQUIRED and not calls:
            return True  # act() reports the missing call
        if self.tool_choices is ToolChoice.AUTO and not calls:
            return bool(content)
        return bool(calls)

    def _chat(self) -> list[dict[str, Any]]:
        """System prompt + the window, without tool messages whose call fell out of the window."""
        chat = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        called: set[str] = set()
        for message in self.memory.messages:
            if message.role is ChatRole.TOOL and message.tool_call_id not in called:
                continue
            called.update(c.id for c in message.tool_calls or ())
            chat.append(message.to_dict())
        return chat

    def _unique_ids(self, calls: list[ToolCall]) -> list[ToolCall]:
        """The calls, each with an id not used before by this agent (models repeat or omit ids)."""
        unique = []
        for call in calls:
            if not call.id or call.id in self.call_ids:
                call = call.model_copy(update={"id": f"call_{self.name}_{len(self.call_ids) + 1}"})
            self.call_ids.add(call.id)
            unique.append(call)
        return unique

    # -- act -------------------------------------------------------------------------------------

    async def act(self) -> str:
        """Execute each tool call; remember each observation as a tool message answering its call.

        Raises:
            ToolCallMissing: Under REQUIRED when the model called no tool.
        """
        if not self.tool_calls:
            if self.tool_choices is ToolChoice.REQUIRED:
                raise ToolCallMissing(f"agent {self.name!r}: tool_choice=required, but the model called no tool")
            return self.memory.messages[-1].content or "No content or commands to execute"
        results = []
        for call in self.tool_calls:
            observation = await self.execute_tool(call)
            if self.max_observe is not None:
                observation = observation[: self.max_observe]
            self.memory.add_message(Message.tool_message(observation, call.function.name, call.id))
            results.append(observation)
        return "\n\n".join(results)

    async def execute_tool(self, call: ToolCall) -> str:
        """Run one call; an unknown tool, broken arguments or a failing tool give an error observation."""
        name = call.function.name
        self._emit("tool_call", tool=name, call_id=call.id, arguments=call.function.arguments)
        observation = await self._observe_call(call)
        self._emit(
            "tool_result",
            tool=name,
            call_id=call.id,
            ok=not observation.startswith("Error"),
            observation=observation[:500],
        )
        return observation

    async def _observe_call(self, call: ToolCall) -> str:
        name = call.function.name
        if name not in self.available_tools.tool_map:
            return f"Error: Unknown tool {name!r}; available: {sorted(self.available_tools.tool_map)}"
        try:
            arguments = parse_json(call.function.arguments or "{}")  # as leniently as structured answers
        except ValueError as exc:
            return f"Error: Parsing arguments for {name!r}: {exc}: {call.function.arguments!r}"
        if not isinstance(arguments, dict):
            return f"Error: Arguments for {name!r} must be a JSON object, got {call.function.arguments!r}"
        try:
            result = await self.available_tools.execute(name=name, tool_input=arguments)
        except RunError:  # the run cannot go on (a tool's server is gone): it stops, resumable
            raise
        except Exception as exc:  # a tool's own bug: the run goes on, the model sees what happened
            return f"Error: Tool {name!r} encountered a problem: {type(exc).__name__}: {exc}"
        if result.error:
            return f"Error: {result.error}"
        self._handle_special_tool(name)
        return (
            f"Observed output of cmd `{name}` executed:\n{result}"
            if str(result)
            else f"Cmd `{name}` completed with no output"
        )

    def _handle_special_tool(self, name: str) -> None:
        if name.lower() in self.special_tool_names:
            self.state = AgentState.FINISHED

    def _emit(self, kind: str, **fields: Any) -> None:
        if self.on_event is not None:
            self.on_event(kind, fields)

    def final_answer(self) -> str:
        """The agent's answer: its last assistant text, else its last observation."""
        for message in reversed(self.memory.messages):
            if message.role is ChatRole.ASSISTANT and message.content:
                return message.content
        for message in reversed(self.memory.messages):
            if message.role is ChatRole.TOOL and message.content:
                return message.content
        return ""
