"""The cost ledger: every model call's role, action, model, tokens, latency and cost; and budgets.

Costs come from a price table per model (USD per 1,000 tokens, editable: pass your own); a model
missing from the table is charged what its response reports (0 for local and test models unless
configured). The ledger is part of a run's saved state, so it survives resume.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from warnings import warn

from pydantic import BaseModel, Field

from metaroles.core.exceptions import UnknownRoleError
from metaroles.llm.model_files import EMBEDDED
from metaroles.llm.protocol import LLM, LLMRequest, LLMResponse


class Price(BaseModel):
    """What a model costs, in USD per 1,000 tokens."""

    prompt: float = Field(ge=0)
    completion: float = Field(ge=0)

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """Cost of one call."""
        return (prompt_tokens * self.prompt + completion_tokens * self.completion) / 1000


DEFAULT_PRICES: dict[str, Price] = {
    "gpt-4o": Price(prompt=0.0025, completion=0.01),
    "gpt-4o-mini": Price(prompt=0.00015, completion=0.0006),
    "gpt-4.1": Price(prompt=0.002, completion=0.008),
    "gpt-4.1-mini": Price(prompt=0.0004, completion=0.0016),
}
"""List prices at the time of writing; edit or replace them to match your provider."""

FREE_MODELS = frozenset({"test", "function", "scripted", *EMBEDDED})
"""The offline models (TestLLM, FunctionLLM, ScriptedLLM, the embedded ones): free by design, never "unpriced"."""


@dataclass(slots=True)
class LedgerEntry:
    """One accounted call (a slotted dataclass: the ledger grows by one per model call)."""

    role: str
    action: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    cost: float
    latency_s: float = 0.0
    """Wall-clock seconds of the call: measured, so kept out of what :meth:`saved` returns."""
    cached_tokens: int = 0
    """Of the prompt tokens, those the server took from its prefix cache (as its answer said)."""
    seed: int | None = None
    """The request's seed, if it set one."""
    temperature: float | None = None
    """The request's temperature, if it set one."""
    max_tokens: int | None = None
    """The request's limit on the answer's tokens, if it set one."""
    finish_reason: str = "stop"
    """Why the answer ended: ``tool_calls`` when it called tools, else ``stop``."""
    ended_ns: int = 0
    """When the answer came (``time.time_ns``): measured, so kept out of what :meth:`saved` returns."""

    @property
    def tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens

    def saved(self) -> dict[str, Any]:
        """The entry as a run directory records it: everything but the clock-measured latency.

        A run directory is a function of the run's seed and model answers; a latency is neither.
        ``cached_tokens`` is part of the answer, written when there are any (the ledgers of runs
        without a prefix cache stay as they were).
        """
        saved: dict[str, Any] = {
            "role": self.role,
            "action": self.action,
            "model": self.model,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost": self.cost,
        }
        if self.cached_tokens:
            saved["cached_tokens"] = self.cached_tokens
        for key in ("seed", "temperature", "max_tokens"):  # what the request set (older ledgers: nothing)
            value = getattr(self, key)
            if value is not None:
                saved[key] = value
        if self.finish_reason != "stop":
            saved["finish_reason"] = self.finish_reason
        return saved


class Spend(BaseModel):
    """Totals of a group of calls."""

    calls: int = 0
    tokens: int = 0
    cost: float = 0.0


class CallObserver(Protocol):
    """Sees each model call a ledger accounts for (telemetry: ``telemetry.tracing``)."""

    def call_done(self, llm: LLM, request: LLMRequest, response: LLMResponse, entry: LedgerEntry) -> None:
        """``llm`` answered ``request``; ``entry`` is what the ledger recorded (its latency included)."""

    def call_failed(self, llm: LLM, request: LLMRequest, error: Exception, latency_s: float) -> None:
        """``llm`` raised ``error`` on ``request`` after ``latency_s`` seconds."""


class CostLedger:
    """Tokens, latency and money spent, per role, action and model.

    Args:
        entries: Entries to start from (a resumed run's ledger).
        prices: Price table by model name (``DEFAULT_PRICES`` by default).
    """

    def __init__(self, entries: list[LedgerEntry] | None = None, *, prices: Mapping[str, Price] | None = None) -> None:
        """Create a ledger, optionally continuing ``entries``."""
        self.prices: dict[str, Price] = dict(DEFAULT_PRICES if prices is None else prices)
        self.entries: list[LedgerEntry] = []
        self.total_cost = 0.0
        self.total_tokens = 0
        self.observer: CallObserver | None = None
        """Sees each call accounted for (``None``: nobody; see ``telemetry.tracing``)."""
        self.reset(entries or [])

    def mark(self) -> tuple[int, float, int]:
        """Where the ledger stands: entries, cost and tokens (see :meth:`recount`)."""
        return len(self.entries), self.total_cost, self.total_tokens

    def recount(self, mark: tuple[int, float, int]) -> None:
        """Recount the totals from ``mark`` over the entries after it, in their order.

        Money is a float sum: after the entries of a round are put in role order, the totals are
        summed in that order too, so they never depend on which call finished first.
        """
        count, self.total_cost, self.total_tokens = mark
        for entry in self.entries[count:]:
            self.total_cost += entry.cost
            self.total_tokens += entry.tokens

    def reset(self, entries: list[LedgerEntry]) -> None:
        """Replace the entries (when a saved run is restored); totals follow."""
        self.entries = list(entries)
        self.total_cost = sum(e.cost for e in self.entries)
        self.total_tokens = sum(e.tokens for e in self.entries)

    def price_for(self, model: str) -> Price | None:
        """The price of ``model``: its own entry, else that of the longest name it extends.

        Providers answer with dated or routed names (``gpt-4o-mini-2024-07-18``,
        ``openai/gpt-4o``): those take the price of ``gpt-4o-mini`` and ``gpt-4o``.
        """
        price = self.prices.get(model)
        if price is not None or not model:
            return price
        bare = model.rpartition("/")[2]
        best = ""
        for name in self.prices:
            if len(name) > len(best) and (bare == name or bare.startswith((f"{name}-", f"{name}:", f"{name}@"))):
                best = name
        return self.prices[best] if best else None

    def unpriced(self, since: int = 0) -> set[str]:
        """Models of the entries from ``since`` on that cost nothing for want of a price (tokens, no cost)."""
        return {
            e.model
            for e in self.entries[since:]
            if e.cost == 0 and e.tokens and e.model not in FREE_MODELS and self.price_for(e.model) is None
        }

    def price_of(self, response: LLMResponse) -> float:
        """The call's cost: from the price table, else what the response reports."""
        price = self.price_for(response.model)
        if price is None:
            return response.cost
        return price.cost(response.usage.prompt_tokens, response.usage.completion_tokens)

    def record(
        self,
        *,
        role: str,
        action: str,
        response: LLMResponse,
        latency_s: float = 0.0,
        request: LLMRequest | None = None,
    ) -> LedgerEntry:
        """Account for one call (with what ``request`` set: seed, temperature, token limit)."""
        entry = LedgerEntry(
            role=role,
            action=action,
            model=response.model,
            prompt_tokens=response.usage.prompt_tokens,
            completion_tokens=response.usage.completion_tokens,
            cost=self.price_of(response),
            latency_s=latency_s,
            cached_tokens=response.usage.cached_tokens,
            finish_reason="tool_calls" if response.tool_calls else "stop",
            ended_ns=time.time_ns(),
        )
        if request is not None:
            entry.seed, entry.temperature, entry.max_tokens = request.seed, request.temperature, request.max_tokens
        self.entries.append(entry)
        self.total_cost += entry.cost
        self.total_tokens += entry.tokens
        return entry

    def spend_by(self, key: str) -> dict[str, Spend]:
        """Calls, tokens and money grouped by ``"role"``, ``"action"`` or ``"model"``."""
        totals: defaultdict[str, Spend] = defaultdict(Spend)
        for entry in self.entries:
            spend = totals[getattr(entry, key)]
            spend.calls += 1
            spend.tokens += entry.tokens
            spend.cost += entry.cost
        return dict(totals)

    def usage_since(self, start: int = 0) -> dict[str, int]:
        """Calls and prompt, cached and completion tokens of the entries from ``start`` on."""
        entries = self.entries[start:]
        return {
            "calls": len(entries),
            "prompt_tokens": sum(e.prompt_tokens for e in entries),
            "cached_tokens": sum(e.cached_tokens for e in entries),
            "completion_tokens": sum(e.completion_tokens for e in entries),
        }

    def cost_by(self, key: str) -> dict[str, float]:
        """Money spent grouped by ``"role"``, ``"action"`` or ``"model"``."""
        return {name: spend.cost for name, spend in self.spend_by(key).items()}

    def dump(self) -> list[dict[str, Any]]:
        """Serialise the entries (without latencies, see :meth:`LedgerEntry.saved`)."""
        return [e.saved() for e in self.entries]

    @classmethod
    def load(cls, data: list[dict[str, Any]], *, prices: Mapping[str, Price] | None = None) -> CostLedger:
        """Restore a ledger serialised by :meth:`dump`."""
        return cls([LedgerEntry(**e) for e in data], prices=prices)


def unpriced_warning(model: str) -> str:
    """What to tell a user whose money budget cannot see ``model``'s calls."""
    return (
        f"model {model!r} has no price, so its calls cost 0 and a money budget cannot stop them; give its price: "
        f"Team(prices={{{model!r}: Price(prompt=..., completion=...)}}) in USD per 1,000 tokens, "
        "or --price MODEL=PROMPT,COMPLETION"
    )


class Budget(BaseModel):
    """A spending bound in money, tokens, or both (``None`` leaves that one unbounded)."""

    max_cost: float | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, gt=0)

    def crossed_by(self, spend: Spend) -> str | None:
        """Say how ``spend`` crosses this budget, or ``None`` if it does not."""
        if self.max_cost is not None and spend.cost >= self.max_cost:
            return f"cost {spend.cost:g} reached the budget of {self.max_cost:g}"
        if self.max_tokens is not None and spend.tokens >= self.max_tokens:
            return f"{spend.tokens} tokens reached the budget of {self.max_tokens}"
        return None


def warn_unpriced(ledger: CostLedger, since: int, budgets: Iterable[Budget | None], warned: set[str]) -> int:
    """Warn once per model (``warned``) whose calls since entry ``since`` cost nothing for want of a price.

    Only when one of ``budgets`` limits money, which such calls escape. Returns where the next check starts.
    """
    if any(b is not None and b.max_cost is not None for b in budgets):
        for model in ledger.unpriced(since) - warned:
            warned.add(model)
            warn(unpriced_warning(model), stacklevel=3)
    return len(ledger.entries)


def budget_crossed(ledger: CostLedger, budget: Budget | None, role_budgets: dict[str, Budget]) -> str | None:
    """Which budget the ledger's spending has crossed (the run's, then each role's, in order), if any."""
    if budget is not None:
        why = budget.crossed_by(Spend(calls=len(ledger.entries), tokens=ledger.total_tokens, cost=ledger.total_cost))
        if why:
            return f"run: {why}"
    if role_budgets:
        by_role = ledger.spend_by("role")
        for name, each in role_budgets.items():
            why = each.crossed_by(by_role.get(name, Spend()))
            if why:
                return f"role {name!r}: {why}"
    return None


def check_role_budgets(role_budgets: Mapping[str, Budget], hired: Iterable[str]) -> None:
    """Refuse role budgets for roles that were not hired, naming them and those that were.

    Raises:
        UnknownRoleError: If a role budget names a role not among ``hired``.
    """
    names = set(hired)
    unknown = sorted(set(role_budgets) - names)
    if unknown:
        raise UnknownRoleError(f"role_budgets name {unknown}, who were not hired; hired: {sorted(names)}")
