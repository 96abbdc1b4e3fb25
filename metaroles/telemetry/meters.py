"""The instruments of a traced run: GenAI client metrics and the bus's own (see ``telemetry.tracing``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from metaroles.llm.ledger import LedgerEntry
from metaroles.llm.protocol import LLM
from metaroles.llm.providers import describe_llm

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter

SYSTEM = "metaroles"
"""``messaging.system`` of the bus's spans; ``gen_ai.provider.name`` of the offline models."""
_PROVIDERS = {"openai": "openai", "local": "llama_cpp"}
USAGE = {
    "input_tokens": "input tokens, cached ones included",
    "output_tokens": "output tokens",
    "cache_read.input_tokens": "input tokens read from the server's cache",
}
"""The token counters of the GenAI conventions (``gen_ai.client.inference.usage.*``): totals and rates."""
PER_CALL = {"input_tokens": "input tokens of a call", "output_tokens": "output tokens of a call"}
"""The per-call token histograms (``gen_ai.client.inference.operation.*``): percentiles."""


def provider_name(llm: LLM) -> str:
    """``gen_ai.provider.name`` of ``llm``: ``openai``, ``llama_cpp``, else ``metaroles`` (the offline models)."""
    return provider_of(str(describe_llm(llm).get("llm", "")))


def provider_of(llm: str) -> str:
    """``gen_ai.provider.name`` of a model as a manifest records its ``llm`` (``openai``, ``local``, ``test:7``…)."""
    return _PROVIDERS.get(llm.partition(":")[0], SYSTEM)


class Meters:
    """The run's instruments: GenAI client token usage and operation duration, and the bus's own.

    Tokens are counted both ways during the conventions' change: the ``gen_ai.client.token.usage``
    histogram (by ``gen_ai.token.type``) that dashboards read today, and the counters and per-call
    histograms that replace it (``gen_ai.client.inference.usage.*``, ``…operation.*``).
    """

    def __init__(self, meter: Meter | None, env: Any) -> None:
        """Make the instruments on ``meter`` (default: the global provider's ``metaroles`` meter) for ``env``'s run."""
        from opentelemetry import metrics

        self._dead, self._started = len(env.dead_letters), 0.0

        meter = meter if meter is not None else metrics.get_meter("metaroles")
        self.tokens = meter.create_histogram("gen_ai.client.token.usage", unit="{token}", description="tokens per call")
        self.usage = {  # the current conventions' token counters (gen-ai-token-metrics), beside the old histogram
            kind: meter.create_counter(f"gen_ai.client.inference.usage.{kind}", unit="{token}", description=what)
            for kind, what in USAGE.items()
        }
        self.per_call = {
            kind: meter.create_histogram(f"gen_ai.client.inference.operation.{kind}", unit="{token}", description=what)
            for kind, what in PER_CALL.items()
        }
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="model call duration"
        )
        self.deliveries = meter.create_counter("metaroles.deliveries", unit="{delivery}", description="deliveries")
        self.dead_letters = meter.create_counter("metaroles.dead_letters", unit="{message}", description="undelivered")
        self.round_duration = meter.create_histogram("metaroles.round.duration", unit="s", description="round time")

    def call(self, llm: LLM, entry: LedgerEntry, error: Exception | None) -> None:
        """Record one model call (its tokens unless it failed, its duration always)."""
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider_name(llm),
            "gen_ai.request.model": str(getattr(llm, "model", "") or ""),
        }
        if error is not None:
            attributes["error.type"] = type(error).__qualname__
        else:
            self.tokens.record(entry.prompt_tokens, {**attributes, "gen_ai.token.type": "input"})
            self.tokens.record(entry.completion_tokens, {**attributes, "gen_ai.token.type": "output"})
            spent = {"input_tokens": entry.prompt_tokens, "output_tokens": entry.completion_tokens,
                     "cache_read.input_tokens": entry.cached_tokens}  # fmt: skip
            for kind, counter in self.usage.items():
                counter.add(spent[kind], attributes)
            for kind, histogram in self.per_call.items():
                histogram.record(spent[kind], attributes)
        self.duration.record(entry.latency_s, attributes)

    def round_begin(self) -> None:
        """A round starts: its duration is measured from now."""
        self._started = time.perf_counter()

    def round_end(self, env: Any, deliveries: int) -> None:
        """Record the round's time, its ``deliveries`` (the round records') and the dead letters since the last."""
        self.deliveries.add(deliveries)
        self.dead_letters.add(len(env.dead_letters) - self._dead)
        self.round_duration.record(time.perf_counter() - self._started)
        self._dead = len(env.dead_letters)
