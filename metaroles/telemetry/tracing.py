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
        self._tools: dict[str, Span] = {}  # call id -> its open execute_tool span
        self._unsent: list[tuple[Message, Span, int]] = []  # published in this round's turns: sent once delivered
        env.keep_records(steps=False)  # what was delivered to whom: the round's record
        self._read = env.round_record().number  # what was published before is no part of this trace
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
        self._sends_since(self._root)
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
        self._sends_since(self._round)
        self.meters.round_end(env)
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
        token = context.attach(trace.set_span_in_context(span, self._round_ctx))
        started, pending, spent = time.time_ns(), len(self.env.published), len(self.env.ledger.entries)
        try:
            return await turn
        except Exception as exc:
            self._failed(span, exc)
            raise
        finally:
            self._processed(role, span, started)
            self._sends_of(role, span, pending)
            entries = self.env.ledger.entries
            if len(entries) > spent:  # the turn called a model: what its calls cost
                span.set_attribute("metaroles.cost", sum(entries[at].cost for at in range(spent, len(entries))))
            context.detach(token)
            span.end()

    def _processed(self, role: Role, span: Span, started: int) -> None:
        """A CONSUMER span per message the turn observed, linked to the span that sent it."""
        trace, link, kind = self._trace, self._trace.Link, self._trace.SpanKind
        parent = trace.set_span_in_context(span)
        for message in role.rc.news:
            sent = self._sent.get(message.id)
            child = self.tracer.start_span(
                f"process {role.name}",
                context=parent,
                kind=kind.CONSUMER,
                links=[link(sent)] if sent is not None else [],
                attributes={
                    "messaging.system": SYSTEM,
                    "messaging.operation.name": "process",
                    "messaging.operation.type": "process",
                    "messaging.message.id": message.id,
                    "messaging.destination.name": self._destination(message),
                    "metaroles.recipient": role.name,
                    "metaroles.round": self.env.round,
                },
                start_time=started,
            )
            child.end(end_time=started)

    def _sends_of(self, role: Role, span: Span, pending: int) -> None:
        """Note each message the turn published: its PRODUCER span is made when the round delivers it."""
        place, now, published = role.place, time.time_ns(), self.env.published
        for at in range(pending, len(published)):  # no slice: a round publishes thousands
            rank, message = published[at]
            if rank == place and message.id not in self._sent:
                self._unsent.append((message, span, now))

    def _sends_since(self, parent: Span | None, round_no: int | None = None) -> None:
        """Send spans for what the round records hold since last time: the turns' first, then the rest under ``parent``.

        Each says to whom delivery gave it (the record's recipients).
        """
        env, sent = self.env, self._sent
        records = env.records_since(self._read)
        delivered = [
            (message, recipients)
            for record in (records if records is not None else [env.round_record()])
            for message, recipients in zip(record.published, record.recipients, strict=True)
            if message.id not in sent
        ]
        self._read = env.round_record().number
        if self._unsent:
            to = {id(message): recipients for message, recipients in delivered}
            unsent, self._unsent = self._unsent, []
            for message, span, started in unsent:
                if id(message) in to:
                    self._send(message, span, to[id(message)], started)
        for message, recipients in delivered:
            if message.id not in sent:
                self._send(message, parent, recipients, round_no=round_no)

    def _send(
        self,
        message: Message,
        parent: Span | None,
        recipients: Sequence[Role] | None,
        started: int | None = None,
        *,
        round_no: int | None = None,
    ) -> None:
        trace, kind = self._trace, self._trace.SpanKind
        attributes = self._message_attributes(message, "send")
        if round_no is not None:
            attributes["metaroles.round"] = round_no
        if recipients is None:  # a sharded round's: its shard routed it
            recipients = self.env.recipients(message)
        attributes["metaroles.delivered_to"] = [role.name for role in recipients]
        span = self.tracer.start_span(
            f"send {self._destination(message)}",
            context=trace.set_span_in_context(parent) if parent is not None else None,
            kind=kind.PRODUCER,
            attributes=attributes,
            start_time=started,
        )
        self._sent[message.id] = span.get_span_context()
        span.end(end_time=started)

    def _message_attributes(self, message: Message, operation: str) -> dict[str, Any]:
        return {
            "messaging.system": SYSTEM,
            "messaging.operation.name": operation,
            "messaging.operation.type": operation,
            "messaging.message.id": message.id,
            "messaging.destination.name": self._destination(message),
            "metaroles.cause_by": message.cause_by,
            "metaroles.sent_from": message.sent_from,
            "metaroles.send_to": sorted(message.send_to),
            "metaroles.round": self.env.round,
        }

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

    def _storages(self, on: bool) -> None:
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
    telemetry._storages(True)
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
        telemetry._storages(False)
