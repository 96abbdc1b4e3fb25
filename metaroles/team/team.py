"""A Team hires roles into an Environment, holds the budget and runs the project until idle, spent or done."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any
from warnings import warn

from metaroles.bus.environment import Environment
from metaroles.bus.role import Role
from metaroles.core.exceptions import ConfigError, InvalidValueError, RoleFailed
from metaroles.core.files import write_atomic
from metaroles.core.heap import paused_gc
from metaroles.core.schema import BROADCAST, to_addresses
from metaroles.core.surface import Dumped
from metaroles.llm.human import find_human
from metaroles.llm.ledger import Budget, CostLedger, Price, budget_crossed, check_role_budgets, warn_unpriced
from metaroles.llm.protocol import LLM
from metaroles.messages.message import Message
from metaroles.record import workspace
from metaroles.record.checkpoint import CheckpointWriter, fresh_writer
from metaroles.record.commit import Called, Logged, Recorder, RoundCommit
from metaroles.record.eventlog import EventLog
from metaroles.record.final_state import refers_to_checkpoint, save_state
from metaroles.sharding.backends import Backend, ShardBy
from metaroles.sharding.cast import Cast
from metaroles.sharding.standins import check_home
from metaroles.team.continuing import forked, resumed
from metaroles.team.control import RunControl
from metaroles.team.options import LogTurns, checked_log_turns
from metaroles.team.report import StopReason, TeamReport
from metaroles.team.runtime import Measured, OneProcess, Runtime, roles_here, runtime_for

__all__ = ["HUMAN", "StopReason", "Team", "TeamReport"]

HUMAN = "Human"
"""``sent_from`` of the idea a Team publishes."""


def seat_person(role: Role) -> None:
    """A person plays ``role`` (``is_human``) where its model asks one (a :class:`HumanLLM`), else its model does."""
    human = find_human(role.llm)
    if human is None:
        warn(f"{role.name} is_human=True, but its model asks no person: give it a HumanLLM (--human)", stacklevel=3)
    elif human.seats is not None:
        human.seats.add(role.name)


def _hired(cast: Cast, llm: LLM | None, index: int) -> Role:
    """The ``index``-th role of ``cast``, as :meth:`Team.hire` gives it: the team's model if it has none, seated."""
    role = cast.build(index)
    if isinstance(role, Role):
        if role.llm is None and llm is not None:
            role.set_llm(llm)
        if role.is_human:
            seat_person(role)
    return role


def _with_llm(env: Environment, llm: LLM | None) -> Environment:
    """``env`` whose roles without a model have ``llm`` (a rebuilt team's roles, as :meth:`Team.hire` gives it)."""
    if llm is not None:
        for role in env.members:
            if role.llm is None:
                role.set_llm(llm)
    return env


class Team(Dumped):
    """Roles, an Environment and budgets.

    Args:
        env: The environment to use (a new one by default).
        llm: Model given to hired roles that have none.
        investment: Money budget of the run; see :meth:`invest`.
        budget: Budget of the run in money and/or tokens.
        role_budgets: Budgets per role name; crossing any stops the run.
        prices: Prices of models the ledger's table lacks (or to override it), by model name; a dated
            name such as ``gpt-4o-mini-2024-07-18`` takes the price of ``gpt-4o-mini``.
        checkpoint_every: With a checkpoint folder, write a checkpoint every this many rounds
            (and when the run stops); a resumed run goes back to the last one.
        log_turns: With an event log, also log each turn's observe, think and act events (``"folded"``, which
            older runs asked for: the same); large societies keep publishes, deliveries, calls and errors.
        backend: Where the roles run: in this process (``None``), or on shards
            (``RayBackend(shards=K)``, ``LocalBackend(shards=K)``); every file of the run is the same.
        idea: The idea the run was given (MetaGPT's field; :meth:`run_project` sets it).

    Attributes:
        stopping: Set it (from any thread, or a signal handler) to stop the run at the next round
            barrier, cleanly (:meth:`stop`).
        control: Steers the run at its round barriers (pause, step, inject: ``team.control``), if set.
        on_round: Called after each round is logged and checkpointed (and after the idea), before the next;
            it may publish.
        on_progress: Called after every round is recorded, only to look (on shards, maybe while the next
            round runs).
        on_record: Called after a round's events are logged, before its checkpoint; only records (as
            ``on_progress``).
        recorders: More of what records each round (``record.commit.Recorder``: one class, one entry here),
            after the log and ``on_record``, before the checkpoint, which makes the files they return
            durable before its own.

    As MetaGPT's Team, it dumps (:meth:`model_dump`) and saves (:meth:`serialize`) as data, and
    ``Team(**dump)`` / :meth:`deserialize` rebuild it mid-run: the next rounds go on as if it never stopped.
    """

    def __init__(
        self,
        *,
        env: Environment | None = None,
        llm: LLM | None = None,
        investment: float | None = None,
        budget: Budget | dict[str, Any] | None = None,
        role_budgets: Mapping[str, Budget] | None = None,
        prices: Mapping[str, Price] | None = None,
        checkpoint_every: int = 1,
        log_turns: LogTurns = True,
        backend: Backend | None = None,
        idea: str = "",
    ) -> None:
        """Create a team; see the class docstring for the arguments."""
        if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 1:
            raise InvalidValueError(f"checkpoint_every={checkpoint_every!r} must be a positive integer, e.g. 1")
        self.checkpoint_every = checkpoint_every
        self.log_turns = checked_log_turns(log_turns)
        self.env = _with_llm(Environment.model_validate(env), llm) if env is not None else Environment()
        self.llm, self.idea = llm, idea
        self.budget = Budget.model_validate(budget) if isinstance(budget, dict) else budget
        self.role_budgets: dict[str, Budget] = dict(role_budgets or {})
        self.env.ledger.prices.update(prices or {})
        self._checked_entries, self._unpriced = 0, set[str]()
        self._checkpoints: CheckpointWriter | None = None
        self._log: EventLog | None = None
        self._measured: Measured | None = None
        self.last_round: int | None = None
        """The round the current run stops at, at the latest (for progress displays)."""
        self.on_round: Callable[[Team], None] | None = None
        self.on_progress: Callable[[Team], None] | None = None
        self.on_record: Callable[[Team], None] | None = None
        self.recorders: list[Recorder] = []
        self._failed = self._stranded = self._idea_due = self._cut = False
        self.stopping = threading.Event()
        self.workspace: Path | None = None
        """The folder the roles' actions write files into, if any: kept with every checkpoint (see ``workspace``)."""
        self._kept: workspace.Files | None = None
        self.backend = backend
        self.shard_by: ShardBy | None = None
        """Which shard a role runs on, when the backend does not say (a scenario's ``shard_by``)."""
        self.metric_parts: list[Callable[[Sequence[Role]], Any]] = []
        """Functions of a list of roles that round metrics combine (:meth:`gathered`); on shards, run where they are."""
        self._runtime: Runtime | None = None
        """Where the current run's rounds run (``None`` between runs: this process)."""
        self.casts: list[tuple[int, Cast]] = []
        """The casts hired, by the place of their first role (shards build those roles themselves)."""
        self.bring_back = True
        """Whether a sharded run's roles come back here; ``False``: not if its ``state.json`` names its checkpoint."""
        self.control: RunControl | None = None
        if investment is not None:
            self.invest(investment)

    def model_dump(self, *, mode: str = "python", **_: Any) -> dict[str, Any]:
        """The team as data (MetaGPT's pydantic dump): its environment whole, its budget and settings.

        The model is not part of it (pass ``llm=`` when rebuilding); nor are callbacks or a backend.
        """
        budget = None if self.budget is None else self.budget.model_dump(mode=mode)
        settings = {"checkpoint_every": self.checkpoint_every, "log_turns": self.log_turns, "idea": self.idea}
        return {"env": self.env.model_dump(mode=mode), "budget": budget, **settings}

    def serialize(self, stg_path: str | Path) -> Path:
        """Save the team (between rounds) as ``team.json`` in the folder ``stg_path``, atomically (MetaGPT's)."""
        folder = Path(stg_path)
        folder.mkdir(parents=True, exist_ok=True)
        return write_atomic(folder / "team.json", self.model_dump_json())

    @classmethod
    def deserialize(cls, stg_path: str | Path, context: object = None, *, llm: LLM | None = None) -> Team:
        """Rebuild a team :meth:`serialize` saved in ``stg_path`` (MetaGPT's ``context`` is not used: pass ``llm=``).

        Raises:
            ConfigError: If the folder holds no ``team.json``.
        """
        path = Path(stg_path) / "team.json"
        if not path.is_file():
            raise ConfigError(f"{path} does not exist; pass the folder Team.serialize wrote to")
        return cls(**json.loads(path.read_text(encoding="utf-8")), llm=llm)

    @property
    def cost_ledger(self) -> CostLedger:
        """Every model call's cost, per role, action and model."""
        return self.env.ledger

    def hire(self, roles: Iterable[Role] | Cast) -> None:
        """Add ``roles`` to the environment; those without a model get the team's.

        A :class:`~metaroles.sharding.cast.Cast`'s roles are built here; on shards, again where each one runs.
        """
        if isinstance(roles, Cast):
            self.casts.append((len(self.env.members), roles))
            if roles.names is not None:
                self.env.add_cast(roles.count, partial(_hired, roles, self.llm), roles.names)
                return
            roles = roles.roles()
        with paused_gc():  # new objects, no garbage: collections would walk every role built so far
            for role in roles:
                if role.llm is None and self.llm is not None:
                    role.set_llm(self.llm)
                if role.is_human:
                    seat_person(role)
                self.env.add_role(role)

    def stop(self) -> None:
        """Stop the run at the next round barrier, cleanly: its state saved, resumable (safe from any thread).

        The round under way finishes (a round is all or nothing), then the run stops with
        :attr:`StopReason.INTERRUPTED`; clear :attr:`stopping` to run the team again.
        """
        self.stopping.set()

    def invest(self, investment: float) -> None:
        """Set the run's money budget: the run stops cleanly once the ledger's total cost reaches it."""
        if isinstance(investment, bool) or not isinstance(investment, int | float) or investment <= 0:
            raise InvalidValueError(f"investment={investment!r} must be a positive number, e.g. invest(3.0)")
        self.budget = Budget(max_cost=float(investment), max_tokens=self.budget and self.budget.max_tokens)

    def run_project(self, idea: str, send_to: object = "") -> Message:
        """Publish ``idea`` as a user requirement to ``send_to`` (every role when empty)."""
        self.idea = idea
        target = BROADCAST if send_to in ("", None) else to_addresses(send_to)
        with self.env.id_scope():
            message = Message(idea, sent_from=HUMAN, send_to=target)
        self.env.publish_message(message)
        return message

    def gathered(self, fn: Callable[[Sequence[Role]], Any]) -> list[Any]:
        """``fn`` of the run's roles: one part per shard (and the driver's) on shards, else one of all roles.

        Round metrics that combine these parts are the same on one process and on many (on shards:
        register ``fn`` in :attr:`metric_parts`).

        Raises:
            RunError: If the run is sharded and ``fn`` is not in :attr:`metric_parts`.
        """
        measured = self._measured if self._runtime is not None else None
        return (measured or Measured({}, here=roles_here(self.env))).gathered(fn)

    @property
    def runtime(self) -> Runtime:
        """Where the rounds run: the current run's runtime, else this process."""
        return self._runtime or OneProcess(self.env)

    def budget_crossed(self) -> str | None:
        """Which budget the spending so far has crossed, if any (a money budget blind to a model warns, once)."""
        budgets, ledger = (self.budget, *self.role_budgets.values()), self.env.ledger
        self._checked_entries = warn_unpriced(ledger, self._checked_entries, budgets, self._unpriced)
        return budget_crossed(ledger, self.budget, self.role_budgets)

    async def run(
        self,
        n_round: int = 3,
        idea: str = "",
        send_to: object = "",
        *,
        save_to: str | Path | None = None,
        checkpoints: str | Path | None = None,
        events: str | Path | None = None,
    ) -> TeamReport:
        """Publish ``idea`` (if any), then run up to ``n_round`` rounds.

        Stops early when every role is idle or a budget is crossed; both are clean stops. With
        ``save_to``, the state is written there when the run stops, cleanly or because a role
        failed. With ``checkpoints`` (a folder), also at the end of every round (``round-NNNN.json``,
        atomically; on shards, once they hold their roles), so :meth:`resume` can continue after a
        crash. With ``events`` (a file), each round's events are appended to it first.

        Raises:
            UnknownRoleError: If a role budget names a role that was not hired.
        """
        self._check(n_round)
        self.last_round = self.env.round + n_round
        if checkpoints is not None and self._checkpoints is None:
            self._checkpoints = fresh_writer(Path(checkpoints))
        self._log = None
        if events is not None:
            self._log = EventLog(Path(events), self.env, through_round=self.env.round, turns=self.log_turns)
        self._failed = self._cut = False
        try:
            if idea:
                self.run_project(idea, send_to)
                self._idea_due = True  # committed as a round of its own once the roles are where they run
            try:
                rounds, reason = await self._run_rounds(n_round)
            finally:  # a clean stop is checkpointed; a failed round is not, so resume runs it again
                await self._final_checkpoint()
        finally:
            writer, self._checkpoints = self._checkpoints, None
            if writer is not None and (save_to is None or self._stranded):
                writer.sync_names()  # the round files' names, once (else synced with state.json, which may name one)
            if save_to is not None and not self._stranded:  # a lost shard took roles: the checkpoint stands
                save_state(self.env, Path(save_to), writer, whole=self._failed or self._cut)
        detail = self.budget_crossed() or "" if reason is StopReason.BUDGET else ""
        return TeamReport.of(self.env, rounds, reason, detail=detail, budget=self.budget)

    def _check(self, n_round: int) -> None:
        if isinstance(n_round, bool) or not isinstance(n_round, int) or n_round < 0:
            raise InvalidValueError(f"n_round={n_round!r} must be a non-negative integer")
        check_home(self.env)
        check_role_budgets(self.role_budgets, self.env.roles)

    async def resume(
        self,
        checkpoints: str | Path,
        n_round: int,
        *,
        save_to: str | Path | None = None,
        events: str | Path | None = None,
        check: Callable[[int], None] | None = None,
    ) -> TeamReport:
        """Continue a run from its last complete checkpoint, until ``n_round`` rounds in all.

        ``check`` is given the restored round before anything on disk changes (a run directory
        checks its other per-round files there) and may refuse by raising.

        The team must have hired the same roles (a scenario rebuilds them from its config). A
        torn or unreadable checkpoint is skipped with a warning and the one before it is used.

        Everything is read and checked before any file changes: a log that cannot be read whole,
        or that stops before the checkpoint's round, is refused.

        Raises:
            ConfigError: If the folder holds no readable checkpoint.
            RunDirCorrupt: If the event log is damaged or lacks rounds the checkpoint holds.
        """
        self._checkpoints, self._kept = resumed(self.env, checkpoints, events=events, check=check, files=self.workspace)
        self.casts = []  # restored roles are not as their casts built them: they travel
        return await self.run(max(0, n_round - self.env.round), save_to=save_to, events=events)

    async def fork(
        self,
        parent: str | Path,
        from_round: int,
        n_round: int,
        *,
        checkpoints: str | Path,
        events: str | Path | None = None,
        parent_events: str | Path | None = None,
        idea: str = "",
        send_to: object = "",
        save_to: str | Path | None = None,
        then: Callable[[Environment], None] | None = None,
    ) -> TeamReport:
        """Branch a run: start from its checkpoint at ``from_round`` and go on in new folders.

        The parent's event log up to ``from_round`` is copied into ``events``, so the child's log
        tells the whole story. ``idea``, if given, is published at the fork point; any other change
        (a role's model, the scenario's config) is made to this team before calling. ``then`` is
        given the environment once it is restored, before the branch's first round (a new seed, an
        edit of its history).

        Raises:
            ConfigError: If the parent has no readable checkpoint up to ``from_round``, or
                ``checkpoints`` already holds a run.
        """
        self._checkpoints = forked(
            self.env, parent, from_round, checkpoints, events=events, parent_events=parent_events, files=self.workspace
        )
        self._kept = None
        self.casts = []  # restored roles are not as their casts built them: they travel
        if then is not None:
            then(self.env)
        return await self.run(max(0, n_round - self.env.round), idea, send_to, save_to=save_to, events=events)

    async def _final_checkpoint(self) -> None:
        """Checkpoint where the run stopped (unless that round was checkpointed), so resume starts there."""
        writer = self._checkpoints
        if writer is not None and writer.round != self.env.round and not (self._failed or self._stranded or self._cut):
            self._keep_files(writer)
            measured = await self.runtime.measure([], writer, due=True)  # on shards: before the roles come back
            if measured.checkpoint is not None:
                measured.checkpoint(self._log.unsynced() if self._log is not None else [])  # the log's lines first

    def _keep_files(self, writer: CheckpointWriter) -> None:
        if self.workspace is not None:
            self._kept = workspace.keep(self.workspace, writer.folder, self.env.round, self._kept)

    async def _checkpoint(self) -> None:
        """Commit the round (``record.commit.RoundCommit``): its events, its metrics, then its checkpoint, last.

        What needs the roles where they run (metric parts, checkpoint parts) is read now; the commit runs
        when the runtime may (on shards, while they run the next round), unless :attr:`on_round` or a
        control is set (they publish to the next round, at its barrier).
        """
        runtime, writer = self.runtime, self._checkpoints
        due = writer is not None and (self.env.round % self.checkpoint_every == 0 or writer.round is None)
        recorders: list[Recorder] = [] if self._log is None else [Logged(self._log, sync=writer is None)]
        if self.on_record is not None:
            recorders.append(Called(partial(self.on_record, self)))
        reports = [partial(self.on_progress, self)] if self.on_progress is not None else []
        commit = RoundCommit([*recorders, *self.recorders], then=reports)
        fns = self.metric_parts if self.on_record is not None else []
        try:
            if writer is not None and due:
                self._keep_files(writer)  # as the round left them: the next one may change them
            self._measured = measured = await runtime.measure(
                fns, writer, due=due, meanwhile=partial(self._early, commit)
            )
        except BaseException:
            self._failed = True  # a round not wholly committed (a full disk): no checkpoint may claim it
            raise
        commit.checkpoint, commit.take_in = measured.checkpoint, measured.take_in
        runtime.commit(partial(self._commit, commit), overlap=self.on_round is None and self.control is None)

    def _early(self, commit: RoundCommit, measured: Measured) -> None:
        """Record the round as the runtime can, before its checkpoint is ready (on shards: while they write parts)."""
        self._measured = measured
        commit.record()

    def _commit(self, commit: RoundCommit) -> None:
        """Run the round's commit, then :attr:`on_round` (it may publish to the next round)."""
        try:
            commit()
        except BaseException:
            self._failed = True
            raise
        if self.on_round is not None:
            self.on_round(self)

    async def _run_rounds(self, n_round: int) -> tuple[int, StopReason]:
        self._stranded = False
        backend = None if n_round == 0 or self.env.is_idle else self.backend  # nothing to run: the roles stay
        hooks = self.on_record or self.on_progress or self.on_round
        reads = self._log is not None or self._checkpoints is not None or hooks is not None
        opened = runtime_for(
            self.env, backend, shard_by=self.shard_by, casts=self.casts, keep=self.bring_back, log=self._log,
            read_between=reads, stay=lambda: not self.bring_back and refers_to_checkpoint(self.env, self._checkpoints),
        )  # fmt: skip
        try:
            async with self.env.session(), opened as runtime:
                self._runtime = runtime
                done = await self._rounds(n_round)
                runtime.close()
                await self._final_checkpoint()
                return done
        finally:
            self._stranded = self.runtime.stranded
            self._runtime = None

    async def _barrier(self) -> bool:
        """At a round barrier: the control's turn (publish what is due, wait while paused); whether to stop here."""
        if self.control is not None and not self.stopping.is_set():
            await self.control.barrier(self.env, self.stopping)
        return self.stopping.is_set()

    async def _rounds(self, n_round: int) -> tuple[int, StopReason]:
        if self._idea_due:
            self._idea_due = False
            await self._checkpoint()
        rounds = 0
        while rounds < n_round:
            if await self._barrier():  # no checkpoint off its schedule: the resumed run is the uninterrupted one
                self._cut = True
                return rounds, StopReason.INTERRUPTED
            if self.runtime.is_idle:
                return rounds, StopReason.IDLE
            if self.budget_crossed():
                return rounds, StopReason.BUDGET
            try:
                await self.runtime.run_round()
            except BaseException as exc:
                self._failed = True  # the round's state is not whole: its checkpoint is never written
                if isinstance(exc, RoleFailed) and self._log is not None:
                    self._log.round_done()  # its role_error reaches the log; resume cuts it back and retries
                raise
            await self._checkpoint()
            rounds += 1
        if self.runtime.is_idle:
            return rounds, StopReason.IDLE
        if self.budget_crossed():
            return rounds, StopReason.BUDGET
        return rounds, StopReason.MAX_ROUNDS
