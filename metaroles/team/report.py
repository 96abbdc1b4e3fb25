"""What a Team run did and why it stopped."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from pydantic import BaseModel

if TYPE_CHECKING:
    from metaroles.bus.environment import Environment
    from metaroles.llm.ledger import Budget


class StopReason(StrEnum):
    """Why a Team run stopped."""

    IDLE = "idle"
    BUDGET = "budget"
    MAX_ROUNDS = "n_round"
    INTERRUPTED = "interrupted"
    """:meth:`Team.stop` asked (Ctrl-C on the command line): stopped at a round barrier, resumable."""


class TeamReport(BaseModel):
    """What a Team run did and why it stopped."""

    rounds: int
    """Rounds run by this call."""
    stop_reason: StopReason
    detail: str = ""
    """For a budget stop: which budget was crossed, and by how much."""
    total_cost: float
    total_tokens: int = 0
    budget: float | None
    """The run's money budget, if any."""
    messages: int
    """Messages in the environment's history."""

    @classmethod
    def of(cls, env: Environment, rounds: int, reason: StopReason, *, detail: str, budget: Budget | None) -> TeamReport:
        """The report of a run of ``env`` that ran ``rounds`` and stopped for ``reason``."""
        ledger = env.ledger
        return cls(
            rounds=rounds,
            stop_reason=reason,
            detail=detail,
            total_cost=ledger.total_cost,
            total_tokens=ledger.total_tokens,
            budget=budget.max_cost if budget is not None else None,
            messages=len(env.history),
        )

    def __str__(self) -> str:
        """One line for humans."""
        budget = "unbounded" if self.budget is None else f"{self.budget:g}"
        detail = f" ({self.detail})" if self.detail else ""
        return (
            f"stopped ({self.stop_reason.value}){detail} after {self.rounds} round(s); {self.messages} message(s); "
            f"{self.total_tokens} tokens; cost {self.total_cost:g} of budget {budget}"
        )
