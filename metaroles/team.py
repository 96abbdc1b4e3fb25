"""A Team hires roles into an Environment, holds the budget and runs the project.

``Team.run`` stops early, cleanly, when every role is idle or when the budget is spent, and
reports why; the environment's state stays intact and can be saved at any point.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel

from metaroles.environment import Environment
from metaroles.exceptions import InvalidValueError
from metaroles.llm import LLM, CostLedger
from metaroles.message import Message
from metaroles.role import Role
from metaroles.schema import BROADCAST, to_addresses

HUMAN = "Human"
"""``sent_from`` of the idea a Team publishes."""


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
    total_cost: float
    budget: float | None
    messages: int
    """Messages in the environment's history."""

    def __str__(self) -> str:
        """One line for humans."""
        budget = "unbounded" if self.budget is None else f"{self.budget:g}"
        return (
            f"stopped ({self.stop_reason.value}) after {self.rounds} round(s); {self.messages} message(s); "
            f"cost {self.total_cost:g} of budget {budget}"
        )


class Team:
    """Roles, an Environment and a budget.

    Args:
        env: The environment to use (a new one by default).
        llm: Model given to hired roles that have none.
        investment: Budget; see :meth:`invest`.
    """

    def __init__(
        self, *, env: Environment | None = None, llm: LLM | None = None, investment: float | None = None
    ) -> None:
        """Create a team; see the class docstring for the arguments."""
        self.env = env if env is not None else Environment()
        self.llm = llm
        self.budget: float | None = None
        if investment is not None:
            self.invest(investment)

    @property
    def cost_ledger(self) -> CostLedger:
        """Every model call's cost, per role, action and model."""
        return self.env.ledger

    def hire(self, roles: Iterable[Role]) -> None:
        """Add ``roles`` to the environment; those without a model get the team's."""
        for role in roles:
            if role.llm is None and self.llm is not None:
                role.set_llm(self.llm)
            self.env.add_role(role)

    def invest(self, investment: float) -> None:
        """Set the budget: the run stops cleanly once the ledger's total cost reaches it."""
        if isinstance(investment, bool) or not isinstance(investment, int | float) or investment <= 0:
            raise InvalidValueError(f"investment={investment!r} must be a positive number, e.g. invest(3.0)")
        self.budget = float(investment)

    def run_project(self, idea: str, send_to: object = "") -> Message:
        """Publish ``idea`` as a user requirement to ``send_to`` (every role when empty)."""
        target = BROADCAST if send_to in ("", None) else to_addresses(send_to)
        message = Message(idea, sent_from=HUMAN, send_to=target)
        self.env.publish_message(message)
        return message

    def _budget_spent(self) -> bool:
        return self.budget is not None and self.env.ledger.total_cost >= self.budget

    async def run(
        self, n_round: int = 3, idea: str = "", send_to: object = "", *, save_to: str | Path | None = None
    ) -> TeamReport:
        """Publish ``idea`` (if any), then run up to ``n_round`` rounds.

        Stops early when every role is idle or the budget is spent; both are clean stops. With
        ``save_to``, the environment's state is written there when the run stops, whether it
        stopped cleanly or because a role failed, so no run is lost.
        """
        if isinstance(n_round, bool) or not isinstance(n_round, int) or n_round < 0:
            raise InvalidValueError(f"n_round={n_round!r} must be a non-negative integer")
        try:
            if idea:
                self.run_project(idea, send_to)
            rounds, reason = await self._run_rounds(n_round)
        finally:
            if save_to is not None:
                self.env.save(save_to)
        return TeamReport(
            rounds=rounds,
            stop_reason=reason,
            total_cost=self.env.ledger.total_cost,
            budget=self.budget,
            messages=len(self.env.history),
        )

    async def _run_rounds(self, n_round: int) -> tuple[int, StopReason]:
        rounds = 0
        while rounds < n_round:
            if self.env.is_idle:
                return rounds, StopReason.IDLE
            if self._budget_spent():
                return rounds, StopReason.BUDGET
            await self.env.run_round()
            rounds += 1
        if self.env.is_idle:
            return rounds, StopReason.IDLE
        if self._budget_spent():
            return rounds, StopReason.BUDGET
        return rounds, StopReason.MAX_ROUNDS
