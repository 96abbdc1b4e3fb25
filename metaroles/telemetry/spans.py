"""A traced run's spans: where ``metaroles run --otel`` sends them, and reading them back as events.

Without a ``TracerProvider`` of the user's, a run gets its own: exporting over OTLP/HTTP when the
standard ``OTEL_EXPORTER_OTLP_*`` variables name an endpoint, else into ``spans.jsonl`` in the run
directory. :func:`events_from_spans` turns spans back into the publish, deliver and model-call
events of the event log, so ``metaroles graph --from-spans`` draws the same graphs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from metaroles.bus.environment import Environment
from metaroles.core.exceptions import RunDirCorrupt
from metaroles.core.files import read_text
from metaroles.telemetry.meters import SYSTEM
from metaroles.telemetry.tracing import Telemetry, traced

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
    from opentelemetry import metrics, trace

    provider = None if _configured(trace.get_tracer_provider()) else _own_provider(out_dir)
    meters = None if _configured(metrics.get_meter_provider()) else _own_meters()
    tracer = provider.get_tracer("metaroles") if provider is not None else None
    meter = meters.get_meter("metaroles") if meters is not None else None
    try:
        with traced(env, scenario=scenario, run_id=run_id, tracer=tracer, meter=meter) as telemetry:
            yield telemetry
    finally:
        for own in (provider, meters):
            if own is not None:
                own.shutdown()  # flushes what is batched


def _configured(provider: object) -> bool:
    """Whether the user installed a global provider (the API's default is a proxy or a no-op)."""
    return type(provider).__name__ not in ("ProxyTracerProvider", "NoOpTracerProvider", "_ProxyMeterProvider")


def _endpoint(signal: str) -> bool:
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
    )


def _own_meters() -> Any:
    """A meter provider exporting over OTLP/HTTP when an endpoint is set (else the no-op one)."""
    from opentelemetry.sdk.metrics import MeterProvider

    if not _endpoint("METRICS"):
        return MeterProvider()  # nowhere to send them: recorded and dropped
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    return MeterProvider(metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())])


def _own_provider(out_dir: Any) -> Any:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", SYSTEM)}))
    if _endpoint("TRACES"):
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


def read_spans(path: Path) -> list[dict[str, Any]]:
    """The spans a run wrote into ``spans.jsonl`` (the SDK's JSON form of each span).

    Raises:
        RunDirCorrupt: If a line is not a span (named by file and line).
    """
    spans = []
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        try:
            span = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            span = {}
        if span is not None and not (isinstance(span, dict) and "name" in span and "attributes" in span):
            raise RunDirCorrupt(f"{path}: line {number} is not a span ({line[:60]!r}); the file is damaged")
        if span is not None:
            spans.append(span)
    return spans


def events_from_spans(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The publish, deliver and model-call events a run's spans tell (the JSON form ``spans.jsonl`` holds).

    A send span gives the publish (its ``caused_by``: what the turn that sent it observed, the
    process spans beside it) and a deliver per recipient; a chat span gives a model call. The
    graphs of ``flow.graph`` built from these equal the ones built from the run's event log.
    """
    observed: dict[str, list[str]] = {}
    for span in spans:
        if span.get("kind") == "SpanKind.CONSUMER" and span.get("parent_id"):
            observed.setdefault(span["parent_id"], []).append(span["attributes"]["messaging.message.id"])
    events: list[dict[str, Any]] = []
    for span in sorted(spans, key=lambda s: (s.get("attributes", {}).get("metaroles.round", 0), s["start_time"])):
        attributes = span.get("attributes", {})
        if span.get("kind") == "SpanKind.PRODUCER":
            events.extend(_message_events(attributes, observed.get(span.get("parent_id") or "", [])))
        elif attributes.get("gen_ai.operation.name") == "chat" and "gen_ai.usage.input_tokens" in attributes:
            events.append(
                {
                    "kind": "llm_call",
                    "round": attributes["metaroles.round"],
                    "role": attributes["gen_ai.agent.name"],
                    "action": attributes["metaroles.action"],
                    "model": attributes.get("gen_ai.response.model", ""),
                    "tokens": attributes["gen_ai.usage.input_tokens"] + attributes["gen_ai.usage.output_tokens"],
                    "cost": attributes.get("metaroles.cost", 0.0),
                    "latency_s": attributes.get("metaroles.latency_s", 0.0),
                }
            )
    return events


def _message_events(attributes: dict[str, Any], caused_by: list[str]) -> list[dict[str, Any]]:
    message_id, round_no = attributes["messaging.message.id"], attributes["metaroles.round"]
    publish = {
        "kind": "publish",
        "round": round_no,
        "role": attributes["metaroles.sent_from"],
        "message_id": message_id,
        "cause_by": attributes["metaroles.cause_by"],
        "send_to": list(attributes["metaroles.send_to"]),
        "caused_by": caused_by,
    }
    delivered = [
        {"kind": "deliver", "round": round_no, "role": name, "message_id": message_id}
        for name in attributes.get("metaroles.delivered_to", [])
    ]
    return [publish, *delivered]
