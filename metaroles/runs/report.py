"""What a Team run did and why it stopped."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel


class StopReason(StrEnum):
    """Why a Team run stopped."""

    IDLE = "idle"
    BUDGET = "budget"
    MAX_ROUNDS = "n_round"


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

    def __str__(self) -> str:
        """One line for humans."""
        budget = "unbounded" if self.budget is None else f"{self.budget:g}"
        detail = f" ({self.detail})" if self.detail else ""
        return (
            f"stopped ({self.stop_reason.value}){detail} after {self.rounds} round(s); {self.messages} message(s); "
            f"{self.total_tokens} tokens; cost {self.total_cost:g} of budget {budget}"
        )
