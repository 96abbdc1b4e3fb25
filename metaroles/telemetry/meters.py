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


def provider_name(llm: LLM) -> str:
    """``gen_ai.provider.name`` of ``llm``: ``openai``, ``llama_cpp``, else ``metaroles`` (the offline models)."""
    return provider_of(str(describe_llm(llm).get("llm", "")))


def provider_of(llm: str) -> str:
    """``gen_ai.provider.name`` of a model as a manifest records its ``llm`` (``openai``, ``local``, ``test:7``…)."""
    return _PROVIDERS.get(llm.partition(":")[0], SYSTEM)


class Meters:
    """The run's instruments: GenAI client token usage and operation duration, and the bus's own."""

    def __init__(self, meter: Meter | None, env: Any) -> None:
        """Make the instruments on ``meter`` (default: the global provider's ``metaroles`` meter) for ``env``'s run."""
        from opentelemetry import metrics

        self._dead, self._started = len(env.dead_letters), 0.0

        meter = meter if meter is not None else metrics.get_meter("metaroles")
        self.tokens = meter.create_histogram("gen_ai.client.token.usage", unit="{token}", description="tokens per call")
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
