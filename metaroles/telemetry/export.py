"""A run's trace after the fact: the span tree of a traced run, made from its record (``metaroles export --otlp``).

A run recorded without ``--otel`` still holds what its trace would have said: the event log (each
round's turns, messages with the news their senders observed and their recipients, model calls,
errors), the ledger (each call's tokens, cost and request parameters) and ``timings.jsonl`` (when
each round began and ended, each call's latency and when its answer came). :func:`export_run`
walks them a round at a time (:func:`~metaroles.record.eventread.iter_rounds`) and makes the spans
:mod:`~metaroles.telemetry.tracing` makes live — the same names, parents, kinds, links and
attributes — timed from the record:

- a round span from its round's start to its end;
- a turn starts with its round and ends when its last model call's answer came (a turn without
  one has no time of its own on record: it ends as it starts); its ``process`` spans sit at its
  start and its ``send`` spans at its end, zero-length as live;
- a ``chat`` span ends when its answer came and starts its latency earlier.

Which roles had a turn: each role that published in the round, observed in it (a log with the turns'
steps), or was delivered something since its last turn. A turn's news are its observe step's (a log
with steps), else what its first message names as observed (``caused_by``), else what was delivered
to it — exact unless a role's watch left some of that unread. Prompt and answer text, tool calls
and long-term memory operations are not in the record and not exported.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry.sdk.trace import SpanProcessor

from metaroles.core.exceptions import ConfigError, RunError
from metaroles.core.text import REDACTED, redacted
from metaroles.record.eventread import Event, iter_rounds, read_timings
from metaroles.telemetry.meters import SYSTEM, provider_of

if TYPE_CHECKING:
    from opentelemetry.trace import Span, SpanContext, Tracer


@dataclass(frozen=True)
class RunFacts:
    """What the spans say of a run besides its record: names, and the model the manifest records.

    Args:
        scenario: The scenario's short name (the root span is ``invoke_workflow {scenario}``).
        run_id: ``gen_ai.conversation.id`` (the run directory's name, as a live trace has it).
        llm: The manifest's ``llm`` (``openai``, ``local``, ``test:SEED``…): gives ``gen_ai.provider.name``.
        model: The manifest's ``model`` (``gen_ai.request.model``; else each call's answering model).
    """

    scenario: str
    run_id: str
    llm: str = ""
    model: str = ""

    @property
    def provider(self) -> str:
        """``gen_ai.provider.name``: as :func:`~metaroles.telemetry.meters.provider_name` names the live model."""
        return provider_of(self.llm)


@dataclass
class _Turn:
    role: str
    news: list[str] = field(default_factory=list)
    observed: bool = False  # news from the turn's observe step or its message: no more guessing
    calls: list[tuple[Event, Mapping[str, Any]]] = field(default_factory=list)
    sends: list[Event] = field(default_factory=list)


def export_run(events: Path, ledger: Sequence[Mapping[str, Any]], facts: RunFacts, tracer: Tracer) -> int:
    """Make the span tree of the run whose event log is ``events`` through ``tracer``; return how many spans.

    ``ledger`` is the run's ``ledger.json`` (its entries in the order of the log's model calls).
    """
    return _Exporter(events, ledger, facts, tracer).run()


class _Exporter:
    """One export: the spans of each round in turn, the messages' send spans kept for the links of their readers."""

    def __init__(self, events: Path, ledger: Sequence[Mapping[str, Any]], facts: RunFacts, tracer: Tracer) -> None:
        from opentelemetry import trace

        self._trace, self.tracer, self.facts, self.events = trace, tracer, facts, events
        self.ledger = iter(ledger)
        timings = read_timings(events)
        self.rounds = {t["seq"]: (t["start_ns"], t["end_ns"]) for t in timings if "start_ns" in t}
        self.answered = {t["seq"]: t["end_ns"] for t in timings if "end_ns" in t and "latency_s" in t}
        self.sent: dict[str, SpanContext] = {}
        self.destinations: dict[str, str] = {}  # message id -> messaging.destination.name
        self.delivered: dict[str, list[str]] = {}  # role -> ids delivered to it since its last turn
        self.count = self.rounds_seen = 0
        self.clock = 0

    def run(self) -> int:
        known = [t for pair in self.rounds.values() for t in pair if t]
        start, end = (min(known), max(known)) if known else (0, 0)
        attributes = {"gen_ai.operation.name": "invoke_workflow", "gen_ai.conversation.id": self.facts.run_id}
        attributes["metaroles.scenario"] = self.facts.scenario
        root = self._span(f"invoke_workflow {self.facts.scenario}", None, attributes, start)
        self.clock = start
        for events in iter_rounds(self.events):
            self._round(root, events)
        root.set_attribute("metaroles.rounds", self.rounds_seen)
        root.end(end_time=max(end, self.clock))
        return self.count

    def _span(self, name: str, parent: Span | None, attributes: dict[str, Any], start: int, **kw: Any) -> Span:
        self.count += 1
        context = self._trace.set_span_in_context(parent) if parent is not None else None
        return self.tracer.start_span(name, context=context, attributes=attributes, start_time=start, **kw)

    # -- a round -------------------------------------------------------------------------------

    def _round(self, root: Span, events: list[Event]) -> None:
        round_no = events[0]["round"]
        start, end = self.rounds.get(events[0]["seq"], (0, 0))
        start = start or self.clock
        self.clock = end = max(end, start)
        turns, loose, deliveries = self._turns(events)
        if round_no == 0:  # what was published before the first round: under the run's span
            self._sends(root, loose, deliveries, end, round_no)
        else:
            self.rounds_seen = round_no
            span = self._span(f"round {round_no}", root, {"metaroles.round": round_no}, start)
            for turn in turns.values():
                self._turn(span, turn, deliveries, round_no, start)
            self._sends(span, loose, deliveries, end, round_no)
            span.set_attribute("metaroles.failed_turns", sum(1 for e in events if e["kind"] == "role_error"))
            span.end(end_time=end)
        for message_id, names in deliveries.items():  # the news of the next turns
            for name in names:
                self.delivered.setdefault(name, []).append(message_id)

    def _turns(self, events: list[Event]) -> tuple[dict[str, _Turn], list[Event], dict[str, list[str]]]:
        """The round's turns (see the module), the messages sent outside them, and each message's recipients."""
        turns: dict[str, _Turn] = {}
        if events[0]["round"]:
            turns = {name: _Turn(name, ids) for name, ids in self.delivered.items()}
            self.delivered = {}
        deliveries: dict[str, list[str]] = defaultdict(list)
        loose: list[Event] = []
        for event in events:
            kind = event["kind"]
            if kind == "observe":
                turn = turns.setdefault(event["role"], _Turn(event["role"]))
                turn.news, turn.observed = list(event["message_ids"]), True
            elif kind == "publish":
                self._published(event, turns, loose)
            elif kind == "deliver":
                deliveries[event["message_id"]].append(event["role"])
            elif kind == "llm_call":
                entry = next(self.ledger, {})
                turns.setdefault(event["role"], _Turn(event["role"])).calls.append((event, entry))
        return turns, loose, deliveries

    @staticmethod
    def _published(event: Event, turns: dict[str, _Turn], loose: list[Event]) -> None:
        """A message: its sender's turn's, or sent outside any turn (before the first round; no news observed)."""
        caused_by = list(event.get("caused_by") or [])
        turn = turns.get(event["role"]) if event["round"] else None
        if turn is None and event["round"] and caused_by:
            turn = turns[event["role"]] = _Turn(event["role"])
        if turn is None:
            loose.append(event)
            return
        if not turn.observed and caused_by:
            turn.news, turn.observed = caused_by, True
        turn.sends.append(event)

    # -- a turn --------------------------------------------------------------------------------

    def _turn(self, parent: Span, turn: _Turn, deliveries: Mapping[str, list[str]], round_no: int, start: int) -> None:
        trace = self._trace
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": turn.role,
            "gen_ai.conversation.id": self.facts.run_id,
            "metaroles.round": round_no,
        }
        span = self._span(f"invoke_agent {turn.role}", parent, attributes, start)
        end = max([start, *(self.answered.get(call["seq"], start) for call, _ in turn.calls)])
        for message_id in turn.news:
            sent = self.sent.get(message_id)
            links = [trace.Link(sent)] if sent is not None else []
            kind = trace.SpanKind.CONSUMER
            attributes = self._process(turn.role, message_id, round_no)
            self._span(f"process {turn.role}", span, attributes, start, kind=kind, links=links).end(end_time=start)
        for call, entry in turn.calls:
            self._chat(span, call, entry, round_no)
        self._sends(span, turn.sends, deliveries, end, round_no)
        if turn.calls:
            span.set_attribute("metaroles.cost", sum(entry.get("cost", 0.0) for _, entry in turn.calls))
        span.end(end_time=end)

    def _process(self, role: str, message_id: str, round_no: int) -> dict[str, Any]:
        return {
            "messaging.system": SYSTEM,
            "messaging.operation.name": "process",
            "messaging.operation.type": "process",
            "messaging.message.id": message_id,
            "messaging.destination.name": self.destinations.get(message_id, ""),
            "metaroles.recipient": role,
            "metaroles.round": round_no,
        }

    def _sends(
        self, parent: Span, messages: list[Event], deliveries: Mapping[str, list[str]], at: int, round_no: int
    ) -> None:
        """A PRODUCER span per message, at ``at``, saying to whom delivery gave it."""
        kind = self._trace.SpanKind.PRODUCER
        for message in messages:
            message_id, send_to = message["message_id"], sorted(message["send_to"])
            destination = self.destinations[message_id] = ",".join(send_to)
            attributes = {
                "messaging.system": SYSTEM,
                "messaging.operation.name": "send",
                "messaging.operation.type": "send",
                "messaging.message.id": message_id,
                "messaging.destination.name": destination,
                "metaroles.cause_by": message["cause_by"],
                "metaroles.sent_from": message["role"],
                "metaroles.send_to": send_to,
                "metaroles.round": round_no,
                "metaroles.delivered_to": list(deliveries.get(message_id, [])),
            }
            span = self._span(f"send {destination}", parent, attributes, at, kind=kind)
            self.sent[message_id] = span.get_span_context()
            span.end(end_time=at)

    def _chat(self, parent: Span, call: Event, entry: Mapping[str, Any], round_no: int) -> None:
        """A CLIENT span for a model call, ending when its answer came."""
        facts, latency = self.facts, call.get("latency_s", 0.0)
        model = facts.model or call["model"]
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": facts.provider,
            "gen_ai.request.model": model,
            "gen_ai.conversation.id": facts.run_id,
            "gen_ai.agent.name": call["role"],
            "metaroles.action": call["action"],
            "metaroles.round": round_no,
        }
        for key in ("seed", "temperature", "max_tokens"):
            if entry.get(key) is not None:
                attributes[f"gen_ai.request.{key}"] = entry[key]
        attributes["gen_ai.response.model"] = call["model"] or model
        attributes["gen_ai.usage.input_tokens"] = entry.get("prompt_tokens", call["tokens"])
        attributes["gen_ai.usage.output_tokens"] = entry.get("completion_tokens", 0)
        attributes["gen_ai.response.finish_reasons"] = [entry.get("finish_reason", "stop")]
        attributes["metaroles.cost"] = call.get("cost", 0.0)
        attributes["metaroles.latency_s"] = latency
        end = self.answered.get(call["seq"]) or self.clock
        kind = self._trace.SpanKind.CLIENT
        self._span(f"chat {model}", parent, attributes, end - int(latency * 1e9), kind=kind).end(end_time=end)


def send_otlp(
    events: Path, ledger: Sequence[Mapping[str, Any]], facts: RunFacts, endpoint: str | None = None
) -> tuple[int, str]:
    """Export the run's span tree (:func:`export_run`) over OTLP/HTTP; return how many spans and where.

    ``endpoint``: a collector's URL (``/v1/traces`` is added to one without a path); ``None``: the
    standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT`` variables,
    else ``http://localhost:4318/v1/traces``. ``OTEL_SERVICE_NAME`` names the service (``metaroles``).

    Raises:
        ExportFailed: If the collector refused a batch or could not be reached (how many spans went).
    """
    import os

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    url = _traces_url(endpoint) if endpoint else None
    exporter = OTLPSpanExporter(endpoint=url) if url else OTLPSpanExporter()
    sender = _Sender(exporter)
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", SYSTEM)})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(sender)
    with _quiet_exporter() as told:
        try:
            count = export_run(events, ledger, facts, provider.get_tracer("metaroles"))
            sender.flush()
        finally:
            provider.shutdown()
    where = str(getattr(exporter, "_endpoint", url or ""))  # what the exporter resolved from the environment
    secret = urlsplit(where).password if "@" in where else None
    where = redacted(where) or ""
    if sender.failed:
        why = f": {told[0]}" if told else ""
        if secret:  # the exporter's own message may quote the URL whole
            why = why.replace(secret, REDACTED)
        raise ExportFailed(f"the OTLP collector at {where} did not take the spans ({sender.sent} of {count} sent){why}")
    return count, where


@contextmanager
def _quiet_exporter() -> Iterator[list[str]]:
    """The OTLP exporter's log (its retries, its failure) kept from stderr; the block gets its messages' gist."""
    import logging

    told: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            told.append(record.getMessage().splitlines()[0][:200])

    logger = logging.getLogger("opentelemetry.exporter.otlp")
    handler, propagate = Keep(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield told
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


class ExportFailed(RunError):
    """A collector refused the exported spans or could not be reached."""


def _traces_url(endpoint: str) -> str:
    """``endpoint`` with ``/v1/traces`` when it names no path (an OTLP/HTTP collector's base URL).

    Raises:
        ConfigError: If it is not an http(s) URL with a host (it is named, its password hidden).
    """
    try:
        parts = urlsplit(endpoint)
        parts.port  # noqa: B018 - a port that is no number raises here
    except ValueError as exc:
        raise ConfigError(f"--otlp {redacted(endpoint)!r} is not a URL ({exc}); e.g. http://localhost:4318") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"--otlp {redacted(endpoint)!r} is not an http(s) URL with a host; e.g. http://localhost:4318"
        )
    if parts.path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


class _Sender(SpanProcessor):
    """A span processor sending ended spans in batches of :data:`BATCH`, synchronously, noting a failure."""

    BATCH = 512

    def __init__(self, exporter: Any) -> None:
        self.exporter = exporter
        self.pending: list[Any] = []
        self.sent = 0
        self.failed = False

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        """Nothing: spans are sent when they end."""

    def on_end(self, span: Any) -> None:
        """Keep ``span``; send the batch when it is full."""
        self.pending.append(span)
        if len(self.pending) >= self.BATCH:
            self.flush()

    def flush(self) -> None:
        """Send what is pending (nothing more once the collector failed)."""
        from opentelemetry.sdk.trace.export import SpanExportResult

        batch, self.pending = self.pending, []
        if batch and not self.failed:
            if self.exporter.export(batch) is SpanExportResult.SUCCESS:
                self.sent += len(batch)
            else:
                self.failed = True

    def shutdown(self) -> None:
        """Stop the exporter."""
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Send what is pending."""
        del timeout_millis
        self.flush()
        return not self.failed
