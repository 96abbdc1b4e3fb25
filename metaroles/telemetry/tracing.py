"""OpenTelemetry for runs: one trace per run, with the GenAI and messaging semantic conventions.

Extra ``otel``. Spans go through the global API (``opentelemetry.trace.get_tracer``), so a user's
own ``TracerProvider`` receives them; nothing here is imported unless a run asks for telemetry,
and a run without it pays nothing (the bus's hooks are ``None``). A run is one trace::

    invoke_workflow {scenario}                 the run (gen_ai.conversation.id: the run's id)
      round {n}                                one per round
        invoke_agent {role}                    one per turn
          process {role}      CONSUMER         one per message the turn observed, linked to its send
          chat {model}        CLIENT           one per model call (tokens, finish reasons, seed, cost)
          send {destination}  PRODUCER         one per message the turn published
      send {destination}                       what was published between rounds (the user's idea)

The bus's messaging spans (process, send) are made as each round ends, from what its turns noted
(their context, times and news) and what the round recorded (who received each message), in one
pass: the SDK's work in a tight loop rather than between turns. ``telemetry.export`` makes the
same tree from a run directory after the fact (``metaroles export RUN --otlp``).

Prompt and answer text is captured only when ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``
is ``true``. Turn spans are timed by the clock; a model call's span ends when the ledger records it
and starts its measured latency earlier.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

from metaroles.bus.environment import Environment
from metaroles.bus.record import Recipients, names_of
from metaroles.bus.role import Role
from metaroles.core.exceptions import ConfigError
from metaroles.llm.ledger import LedgerEntry
from metaroles.llm.protocol import LLM, LLMRequest, LLMResponse
from metaroles.messages.message import Message
from metaroles.telemetry.meters import SYSTEM, Meters, provider_name

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter
    from opentelemetry.trace import Span, SpanContext, Tracer

CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The standard switch for prompt and answer text in spans (off unless ``true``)."""


def require_otel() -> None:
    """Check that the ``otel`` extra is installed.

    Raises:
        ConfigError: If it is not (the message says what to install).
    """
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        raise ConfigError(
            "--otel needs OpenTelemetry: pip install 'metaroles[otel]' (opentelemetry-api, -sdk, the OTLP exporter)"
        ) from None


def capture_content(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether spans carry prompt and answer text (``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``)."""
    return environ.get(CAPTURE_CONTENT, "").strip().lower() == "true"


class Telemetry:
    """The spans of one environment's run (see the module docstring); :func:`traced` sets it up.

    Args:
        env: The environment whose rounds, turns and model calls become spans.
        scenario: Names the run's root span.
        run_id: ``gen_ai.conversation.id`` of every GenAI span (the run directory's name, by default).
        tracer: Where spans go (default: the global provider's ``metaroles`` tracer).
        content: Capture prompt and answer text (default: the standard environment variable).
    """

    def __init__(
        self,
        env: Environment,
        *,
        scenario: str,
        run_id: str,
        tracer: Tracer | None = None,
        content: bool | None = None,
        meter: Meter | None = None,
    ) -> None:
        """Prepare the spans and instruments; :meth:`begin` opens the root span."""
        from opentelemetry import context, trace

        self._context, self._trace = context, trace  # trace also holds SpanKind, Link, Status, StatusCode
        self.env = env
        self.scenario = scenario
        self.run_id = run_id
        self.tracer = tracer if tracer is not None else trace.get_tracer("metaroles")
        self.content = capture_content() if content is None else content
        self.meters = Meters(meter, env)
        self._sent: dict[str, SpanContext] = {}
        self._destinations: dict[frozenset[str], str] = {}
        self._sorted: dict[frozenset[str], list[str]] = {}
        self._recipients: dict[int, tuple[Any, list[str]]] = {}  # id of the recipients' places (or roles) -> names
        self._tools: dict[str, Span] = {}  # call id -> its open execute_tool span
        self._deliveries = 0  # the deliveries the records held since the last round ended (the metric's)
        self._turns: list[tuple[str, Any, int, int, list[Message]]] = []  # name, context, start, end, news
        self._records = env.record_reader(steps=False)  # what was delivered to whom; what came before is not traced
        self._root: Span | None = None
        self._round: Span | None = None
        self._ctx: Any = None
        self._round_ctx: Any = None

    # -- the run and its rounds ------------------------------------------------------------------

    def begin(self) -> None:
        """Open the run's root span, ``invoke_workflow {scenario}``."""
        trace = self._trace
        attributes = {"gen_ai.operation.name": "invoke_workflow", "gen_ai.conversation.id": self.run_id}
        self._root = self.tracer.start_span(f"invoke_workflow {self.scenario}", attributes=attributes)
        self._root.set_attribute("metaroles.scenario", self.scenario)
        self._ctx = trace.set_span_in_context(self._root)
        self._sends_since(self._root)

    def end(self, error: BaseException | None = None) -> None:
        """Close the root span (with ``error.type`` when the run failed)."""
        if self._root is None:
            return
        self._messaging(self._root)  # a round that failed before its end: its turns' messages still
        if error is not None:
            self._failed(self._root, error)
        self._root.set_attribute("metaroles.rounds", self.env.round)
        self._root.end()
        self._root = None

    def round_begin(self, env: Any) -> None:
        """Open round ``env.round``'s span (what was published before it gets its send spans first)."""
        trace = self._trace
        self._sends_since(self._root, env.round - 1)  # published between the rounds: logged with the one before
        self.meters.round_begin()
        self._round = self.tracer.start_span(
            f"round {env.round}", context=self._ctx, attributes={"metaroles.round": env.round}
        )
        self._round_ctx = trace.set_span_in_context(self._round)

    def round_end(self, env: Any, failures: list[tuple[Role, Exception]]) -> None:
        """Close the round's span: its turns' messages are delivered now, so their send spans say to whom.

        Messages published outside any turn get their send spans under the round's.
        """
        if self._round is None:
            return
        self._messaging(self._round)
        self.meters.round_end(env, self._deliveries)
        self._deliveries = 0
        self._round.set_attribute("metaroles.failed_turns", len(failures))
        self._round.end()
        self._round = None

    # -- turns -------------------------------------------------------------------------------------

    async def turn(self, role: Role, turn: Coroutine[Any, Any, Any]) -> Any:
        """Run ``turn`` inside its ``invoke_agent {role}`` span, with the turn's process and send spans."""
        context, trace = self._context, self._trace
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": role.name,
            "gen_ai.conversation.id": self.run_id,
            "metaroles.round": self.env.round,
        }
        span = self.tracer.start_span(f"invoke_agent {role.name}", context=self._round_ctx, attributes=attributes)
        inside = trace.set_span_in_context(span, self._round_ctx)  # the turn's spans' parent, made once
        token = context.attach(inside)
        started, spent = time.time_ns(), len(self.env.ledger.entries)
        try:
            return await turn
        except Exception as exc:
            self._failed(span, exc)
            raise
        finally:
            self._turns.append((role.name, inside, started, time.time_ns(), role.rc.news))  # spans at the round's end
            entries = self.env.ledger.entries
            if len(entries) > spent:  # the turn called a model: what its calls cost
                span.set_attribute("metaroles.cost", sum(entries[at].cost for at in range(spent, len(entries))))
            context.detach(token)
            span.end()

    def _messaging(self, parent: Span | None) -> None:
        """The round's messaging spans, made as it ends from what its turns noted and what it recorded.

        Per turn a CONSUMER span for each message it observed (linked to that message's send), then
        a PRODUCER span for each message delivered: a turn's under its turn, at the turn's end; the
        rest under ``parent``. The SDK's work runs in one tight loop per round, not between turns.
        """
        turns, self._turns = self._turns, []
        for name, inside, started, _, news in turns:
            self._processed_by(name, inside, started, news)
        self._sends_since(parent, turns={name: (inside, ended) for name, inside, _, ended, _ in turns})

    def _processed_by(self, name: str, parent: Any, started: int, news: Sequence[Message]) -> None:
        link, kind = self._trace.Link, self._trace.SpanKind
        for message in news:
            sent = self._sent.get(message.id)
            child = self.tracer.start_span(
                f"process {name}",
                context=parent,
                kind=kind.CONSUMER,
                links=[link(sent)] if sent is not None else [],
                attributes={
                    "messaging.system": SYSTEM,
                    "messaging.operation.name": "process",
                    "messaging.operation.type": "process",
                    "messaging.message.id": message.id,
                    "messaging.destination.name": self._destination(message),
                    "metaroles.recipient": name,
                    "metaroles.round": self.env.round,
                },
                start_time=started,
            )
            child.end(end_time=started)

    def _sends_since(
        self, parent: Span | None, round_no: int | None = None, turns: Mapping[str, tuple[Any, int]] | None = None
    ) -> None:
        """Send spans for what the round records hold since last time: the turns' under them, the rest under ``parent``.

        ``turns``: each sender's turn's context and end. Each span says to whom delivery gave it (the
        record's recipients).
        """
        sent = self._sent
        delivered = [
            (message, recipients)
            for record in self._records.take()
            for message, recipients in zip(record.published, record.recipients, strict=True)
            if message.id not in sent
        ]
        outside = self._trace.set_span_in_context(parent) if delivered and parent is not None else None
        for message, recipients in delivered:
            turn = turns.get(message.sent_from) if turns else None
            if turn is not None:
                self._send(message, turn[0], recipients, turn[1])
            elif message.id not in sent:
                self._send(message, outside, recipients, round_no=round_no)

    def _send(
        self,
        message: Message,
        parent: Any,
        recipients: Recipients,
        started: int | None = None,
        *,
        round_no: int | None = None,
    ) -> None:
        """The PRODUCER span of ``message`` under the context ``parent``, saying to whom delivery gave it."""
        self._deliveries += len(recipients)
        destination = self._destination(message)
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.name": "send",
            "messaging.operation.type": "send",
            "messaging.message.id": message.id,
            "messaging.destination.name": destination,
            "metaroles.cause_by": message.cause_by,
            "metaroles.sent_from": message.sent_from,
            "metaroles.send_to": self._addresses(message.send_to),
            "metaroles.round": self.env.round if round_no is None else round_no,
            "metaroles.delivered_to": self._names(recipients),
        }
        kind = self._trace.SpanKind.PRODUCER
        span = self.tracer.start_span(
            f"send {destination}", context=parent, kind=kind, attributes=attributes, start_time=started
        )
        self._sent[message.id] = span.get_span_context()
        span.end(end_time=started)

    def _names(self, recipients: Recipients) -> list[str]:
        """``metaroles.delivered_to``: the names of the places (or roles), kept by the object they came as."""
        if len(self._recipients) >= 1 << 16:
            self._recipients.clear()
        known = self._recipients.get(id(recipients))
        if known is not None and known[0] is recipients:
            return known[1]
        names = names_of(recipients, self.env.name_at)
        self._recipients[id(recipients)] = (recipients, names)
        return names

    def _addresses(self, send_to: frozenset[str]) -> list[str]:
        """``metaroles.send_to``: the sorted addresses, memoised (the SDK keeps its own copy of a list attribute)."""
        addresses = self._sorted.get(send_to)
        if addresses is None:
            addresses = self._sorted[send_to] = sorted(send_to)
        return addresses

    def _destination(self, message: Message) -> str:
        """``messaging.destination.name``: the sorted addresses, memoised (a run reuses a few)."""
        name = self._destinations.get(message.send_to)
        if name is None:
            name = self._destinations[message.send_to] = ",".join(sorted(message.send_to))
        return name

    def _failed(self, span: Span, error: BaseException | str, kind: str = "") -> None:
        span.set_attribute("error.type", kind or type(error).__qualname__)
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(error)[:200]))

    # -- tool calls (an agent's) --------------------------------------------------------------------

    def agent_event(self, role: Role, kind: str, fields: dict[str, Any]) -> None:
        """Open an ``execute_tool {tool}`` span on a tool call; close it on the call's result."""
        if kind == "tool_call":
            attributes: dict[str, Any] = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": fields.get("tool", ""),
                "gen_ai.tool.call.id": fields.get("call_id", ""),
                "gen_ai.agent.name": role.name,
                "gen_ai.conversation.id": self.run_id,
                "metaroles.round": self.env.round,
            }
            if self.content:
                attributes["gen_ai.tool.call.arguments"] = str(fields.get("arguments", ""))
            tool = fields.get("tool", "")
            self._tools[fields.get("call_id", "")] = self.tracer.start_span(
                f"execute_tool {tool}", attributes=attributes
            )
        elif kind == "tool_result":
            span = self._tools.pop(fields.get("call_id", ""), None)
            if span is None:
                return
            if not fields.get("ok", True):
                self._failed(span, str(fields.get("observation", "")), "ToolError")
            if self.content:
                span.set_attribute("gen_ai.tool.call.result", str(fields.get("observation", "")))
            span.end()

    # -- long-term memory ------------------------------------------------------------------------

    def storage_op(self, role: str, model: str, operation: str, count: int, seconds: float) -> None:
        """An ``embeddings {model}`` or ``retrieval`` span for what a role's long-term memory just did."""
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.agent.name": role,
            "gen_ai.conversation.id": self.run_id,
            "metaroles.round": self.env.round,
            "metaroles.count": count,
        }
        if operation == "embeddings":
            attributes["gen_ai.request.model"] = model
        name, start = f"embeddings {model}" if operation == "embeddings" else "retrieval", time.time_ns()
        self.tracer.start_span(name, attributes=attributes, start_time=start - int(seconds * 1e9)).end()

    def watch_storages(self, on: bool) -> None:
        """Tell (or stop telling) every role's long-term storage to report to this telemetry."""
        for role in self.env.roles.values():
            rc = getattr(role, "rc", None)  # a shard's stand-in has none
            storage = getattr(rc.memory, "memory_storage", None) if rc is not None else None
            if storage is not None:
                name, model = role.name, storage.embedding.name
                storage.observer = partial(self.storage_op, name, model) if on else None

    # -- model calls (the ledger's observer) ---------------------------------------------------------

    def call_done(self, llm: LLM, request: LLMRequest, response: LLMResponse, entry: LedgerEntry) -> None:
        """A ``chat {model}`` span for a call the ledger recorded, timed by its measured latency."""
        span = self._chat(llm, request, entry.latency_s)
        span.set_attribute("gen_ai.response.model", response.model or str(getattr(llm, "model", "")))
        span.set_attribute("gen_ai.usage.input_tokens", entry.prompt_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", entry.completion_tokens)
        span.set_attribute("gen_ai.response.finish_reasons", ["tool_calls" if response.tool_calls else "stop"])
        span.set_attribute("metaroles.cost", entry.cost)
        span.set_attribute("metaroles.latency_s", entry.latency_s)
        self.meters.call(llm, entry, None)
        if self.content:
            answer: dict[str, Any] = {"role": "assistant", "content": response.text}
            if response.tool_calls:
                answer["tool_calls"] = [call.model_dump(mode="json") for call in response.tool_calls]
            span.set_attribute("gen_ai.output.messages", json.dumps([answer], ensure_ascii=False))
        span.end()

    def call_failed(self, llm: LLM, request: LLMRequest, error: Exception, latency_s: float) -> None:
        """A ``chat {model}`` span with ``error.type`` for a call that raised."""
        span = self._chat(llm, request, latency_s)
        self._failed(span, error)
        span.end()
        self.meters.call(llm, LedgerEntry(request.role, request.action, "", 0, 0, 0.0, latency_s), error)

    def _chat(self, llm: LLM, request: LLMRequest, latency_s: float) -> Span:
        model = str(getattr(llm, "model", "") or "")
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider_name(llm),
            "gen_ai.request.model": model,
            "gen_ai.conversation.id": self.run_id,
            "gen_ai.agent.name": request.role,
            "metaroles.action": request.action,
            "metaroles.round": self.env.round,
        }
        for key, value in (("seed", request.seed), ("temperature", request.temperature)):
            if value is not None:
                attributes[f"gen_ai.request.{key}"] = value
        if request.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = request.max_tokens
        if self.content:
            attributes["gen_ai.input.messages"] = json.dumps(request.messages, ensure_ascii=False)
        start = time.time_ns() - int(latency_s * 1e9)
        kind = self._trace.SpanKind
        return self.tracer.start_span(f"chat {model}", kind=kind.CLIENT, attributes=attributes, start_time=start)


@contextmanager
def traced(
    env: Environment,
    *,
    scenario: str,
    run_id: str,
    tracer: Tracer | None = None,
    content: bool | None = None,
    meter: Meter | None = None,
) -> Iterator[Telemetry]:
    """Trace ``env``'s run inside the block: its rounds, turns, model calls and messages become spans.

    Raises:
        ConfigError: If the ``otel`` extra is not installed.
    """
    require_otel()
    telemetry = Telemetry(env, scenario=scenario, run_id=run_id, tracer=tracer, content=content, meter=meter)
    env.observer, env.ledger.observer = telemetry, telemetry
    telemetry.watch_storages(True)
    telemetry.begin()
    try:
        yield telemetry
    except BaseException as exc:
        telemetry.end(exc)
        raise
    else:
        telemetry.end()
    finally:
        env.observer, env.ledger.observer = None, None
        telemetry.watch_storages(False)
