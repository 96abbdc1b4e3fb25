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
from collections.abc import Coroutine, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from metaroles.bus.environment import Environment
from metaroles.bus.role import Role
from metaroles.core.exceptions import ConfigError
from metaroles.llm.ledger import LedgerEntry
from metaroles.llm.protocol import LLM, LLMRequest, LLMResponse
from metaroles.llm.providers import describe_llm
from metaroles.messages.message import Message

if TYPE_CHECKING:
    from opentelemetry.trace import Span, SpanContext, Tracer

CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The standard switch for prompt and answer text in spans (off unless ``true``)."""
SYSTEM = "metaroles"
"""``messaging.system`` of the bus's spans."""
_PROVIDERS = {"openai": "openai", "local": "llama_cpp"}


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


def provider_name(llm: LLM) -> str:
    """``gen_ai.provider.name`` of ``llm``: ``openai``, ``llama_cpp``, else ``metaroles`` (the offline models)."""
    kind = str(describe_llm(llm).get("llm", ""))
    return _PROVIDERS.get(kind, SYSTEM)


def _destination(message: Message) -> str:
    return ",".join(sorted(message.send_to))


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
    ) -> None:
        """Prepare the spans; :meth:`begin` opens the root span."""
        from opentelemetry import context, trace
        from opentelemetry.trace import Link, SpanKind, Status, StatusCode

        self._otel = (context, trace, Link, SpanKind, Status, StatusCode)
        self.env = env
        self.scenario = scenario
        self.run_id = run_id
        self.tracer = tracer if tracer is not None else trace.get_tracer("metaroles")
        self.content = capture_content() if content is None else content
        self._sent: dict[str, SpanContext] = {}
        self._published = len(env.history)
        self._root: Span | None = None
        self._round: Span | None = None
        self._ctx: Any = None
        self._round_ctx: Any = None

    # -- the run and its rounds ------------------------------------------------------------------

    def begin(self) -> None:
        """Open the run's root span, ``invoke_workflow {scenario}``."""
        trace = self._otel[1]
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
        trace = self._otel[1]
        self._sends_since(self._root)
        self._round = self.tracer.start_span(
            f"round {env.round}", context=self._ctx, attributes={"metaroles.round": env.round}
        )
        self._round_ctx = trace.set_span_in_context(self._round)

    def round_end(self, env: Any, failures: list[tuple[Role, Exception]]) -> None:
        """Close the round's span; messages published outside any turn get their send spans under it."""
        if self._round is None:
            return
        self._sends_since(self._round)
        self._round.set_attribute("metaroles.failed_turns", len(failures))
        self._round.end()
        self._round = None

    # -- turns -------------------------------------------------------------------------------------

    async def turn(self, role: Role, turn: Coroutine[Any, Any, Any]) -> Any:
        """Run ``turn`` inside its ``invoke_agent {role}`` span, with the turn's process and send spans."""
        context, trace = self._otel[0], self._otel[1]
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": role.name,
            "gen_ai.conversation.id": self.run_id,
            "metaroles.round": self.env.round,
        }
        span = self.tracer.start_span(f"invoke_agent {role.name}", context=self._round_ctx, attributes=attributes)
        token = context.attach(trace.set_span_in_context(span, self._round_ctx))
        started, pending, spent = time.time_ns(), len(self.env._pending), len(self.env.ledger.entries)
        try:
            return await turn
        except Exception as exc:
            self._failed(span, exc)
            raise
        finally:
            self._processed(role, span, started)
            self._sends_of(role, span, pending)
            span.set_attribute("metaroles.cost", sum(e.cost for e in self.env.ledger.entries[spent:]))
            context.detach(token)
            span.end()

    def _processed(self, role: Role, span: Span, started: int) -> None:
        """A CONSUMER span per message the turn observed, linked to the span that sent it."""
        trace, link, kind = self._otel[1], self._otel[2], self._otel[3]
        parent = trace.set_span_in_context(span)
        for message in role.rc.news:
            sent = self._sent.get(message.id)
            child = self.tracer.start_span(
                f"process {role.name}",
                context=parent,
                kind=kind.CONSUMER,
                links=[link(sent)] if sent is not None else [],
                attributes={**self._message_attributes(message, "process"), "metaroles.recipient": role.name},
                start_time=started,
            )
            child.end(end_time=started)

    def _sends_of(self, role: Role, span: Span, pending: int) -> None:
        """A PRODUCER span per message the turn published (the round delivers it at its end)."""
        place = role.place
        for rank, message in self.env._pending[pending:]:
            if rank == place and message.id not in self._sent:
                self._send(message, span)

    def _sends_since(self, parent: Span | None) -> None:
        """Send spans for what entered the history since last time without one (published outside a turn)."""
        history = self.env.history
        if len(history) > self._published:
            for message in history.get(len(history) - self._published):
                if message.id not in self._sent:
                    self._send(message, parent)
        self._published = len(history)

    def _send(self, message: Message, parent: Span | None) -> None:
        trace, kind = self._otel[1], self._otel[3]
        span = self.tracer.start_span(
            f"send {_destination(message)}",
            context=trace.set_span_in_context(parent) if parent is not None else None,
            kind=kind.PRODUCER,
            attributes=self._message_attributes(message, "send"),
        )
        self._sent[message.id] = span.get_span_context()
        span.end()

    def _message_attributes(self, message: Message, operation: str) -> dict[str, Any]:
        return {
            "messaging.system": SYSTEM,
            "messaging.operation.name": operation,
            "messaging.operation.type": operation,
            "messaging.message.id": message.id,
            "messaging.destination.name": _destination(message),
            "metaroles.cause_by": message.cause_by,
            "metaroles.sent_from": message.sent_from,
            "metaroles.send_to": sorted(message.send_to),
            "metaroles.round": self.env.round,
        }

    def _failed(self, span: Span, error: BaseException) -> None:
        status, code = self._otel[4], self._otel[5]
        span.set_attribute("error.type", type(error).__qualname__)
        span.set_status(status(code.ERROR, str(error)[:200]))

    # -- model calls (the ledger's observer) ---------------------------------------------------------

    def call_done(self, llm: LLM, request: LLMRequest, response: LLMResponse, entry: LedgerEntry) -> None:
        """A ``chat {model}`` span for a call the ledger recorded, timed by its measured latency."""
        span = self._chat(llm, request, entry.latency_s)
        span.set_attribute("gen_ai.response.model", response.model or str(getattr(llm, "model", "")))
        span.set_attribute("gen_ai.usage.input_tokens", entry.prompt_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", entry.completion_tokens)
        span.set_attribute("gen_ai.response.finish_reasons", ["tool_calls" if response.tool_calls else "stop"])
        span.set_attribute("metaroles.cost", entry.cost)
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

    def _chat(self, llm: LLM, request: LLMRequest, latency_s: float) -> Span:
        model = str(getattr(llm, "model", "") or "")
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider_name(llm),
            "gen_ai.request.model": model,
            "gen_ai.conversation.id": self.run_id,
            "gen_ai.agent.name": request.role,
            "metaroles.action": request.action,
        }
        for key, value in (("seed", request.seed), ("temperature", request.temperature)):
            if value is not None:
                attributes[f"gen_ai.request.{key}"] = value
        if request.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = request.max_tokens
        if self.content:
            attributes["gen_ai.input.messages"] = json.dumps(request.messages, ensure_ascii=False)
        start = time.time_ns() - int(latency_s * 1e9)
        kind = self._otel[3]
        return self.tracer.start_span(f"chat {model}", kind=kind.CLIENT, attributes=attributes, start_time=start)


@contextmanager
def traced(
    env: Environment,
    *,
    scenario: str,
    run_id: str,
    tracer: Tracer | None = None,
    content: bool | None = None,
) -> Iterator[Telemetry]:
    """Trace ``env``'s run inside the block: its rounds, turns, model calls and messages become spans.

    Raises:
        ConfigError: If the ``otel`` extra is not installed.
    """
    require_otel()
    telemetry = Telemetry(env, scenario=scenario, run_id=run_id, tracer=tracer, content=content)
    env.observer, env.ledger.observer = telemetry, telemetry
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


SPANS = "spans.jsonl"
"""Where a run with ``--otel`` and no OTLP endpoint writes its spans: one JSON object per line, in its run directory."""


@contextmanager
def run_telemetry(env: Environment, *, scenario: str, run_id: str, out_dir: Any) -> Iterator[Telemetry]:
    """Trace a scenario run (``metaroles run … --otel``), configured by the standard ``OTEL_*`` variables.

    A ``TracerProvider`` the user installed receives the spans. Without one, the run gets its own:
    exporting over OTLP/HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``…_TRACES_ENDPOINT``) is
    set, else into ``spans.jsonl`` in the run directory. Spans are timed by the clock, so that file
    is outside the byte-for-byte contract, like the manifest's timestamps.
    """
    from opentelemetry import trace

    if type(trace.get_tracer_provider()).__name__ not in ("ProxyTracerProvider", "NoOpTracerProvider"):
        with traced(env, scenario=scenario, run_id=run_id) as telemetry:
            yield telemetry
        return
    provider = _own_provider(out_dir)
    try:
        with traced(env, scenario=scenario, run_id=run_id, tracer=provider.get_tracer("metaroles")) as telemetry:
            yield telemetry
    finally:
        provider.shutdown()  # flushes what is batched


def _own_provider(out_dir: Any) -> Any:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", SYSTEM)}))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    elif out_dir is not None:
        provider.add_span_processor(SimpleSpanProcessor(_lines_exporter(out_dir / SPANS)))
    return provider


def _lines_exporter(path: Any) -> Any:
    """A span exporter appending each span as one JSON line to ``path``."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class LinesExporter(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            with open(path, "a", encoding="utf-8") as handle:
                for span in spans:
                    handle.write(json.dumps(json.loads(span.to_json()), separators=(",", ":")) + "\n")
            return SpanExportResult.SUCCESS

    return LinesExporter()


def read_spans(path: Any) -> list[dict[str, Any]]:
    """The spans a run wrote into ``spans.jsonl`` (the SDK's JSON form of each span)."""
    text = open(path, encoding="utf-8").read()
    return [json.loads(line) for line in text.splitlines() if line.strip()]
