"""Ids inside a run derive from the seed and the logical position; outside a run they are unique per process."""

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from metaroles import Action, Environment, Message, Role, Team
from metaroles.core.ids import IdScope, id_scope, new_id, run_key


def test_outside_a_run_ids_are_unique_32_hex_digits():
    ids = [new_id() for _ in range(1000)] + [Message("x").id for _ in range(1000)]
    assert len(set(ids)) == 2000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_a_scope_gives_key_round_slot_and_sequence():
    scope = IdScope(run_key(7), 3)
    with id_scope(scope.at(2)):
        first, second = Message("a").id, new_id()
    assert first == f"{run_key(7)}{2:06x}{3:05x}{0:05x}" and second.endswith(f"{1:05x}")
    assert scope.at(2).next().endswith(f"{2:05x}"), "the sequence goes on within a round"
    assert scope.at(3).next().endswith(f"{0:05x}"), "and restarts with the next round"
    assert run_key(7) == run_key(7) != run_key(8)
    assert run_key(None) != run_key(None), "no seed: a random key"


class Gate:
    """Decides, per round, in which order the roles' actions finish."""

    def __init__(self, order: list[str]) -> None:
        self.order = order
        self.done = {name: anyio.Event() for name in order}

    async def wait_turn(self, name: str) -> None:
        index = self.order.index(name)
        if index:
            await self.done[self.order[index - 1]].wait()

    def finished(self, name: str) -> None:
        self.done[name].set()


class Answer(Action):
    def __init__(self, gate: Gate) -> None:
        super().__init__()
        self.gate = gate

    async def run(self, history: list[Message]) -> Message:
        await self.gate.wait_turn(self.role_name)
        extra = Message(f"note of {self.role_name}")  # an id made mid-turn, as tool calls are
        reply = Message(f"{self.role_name} answers {len(history)}; {extra.id[-5:]}")
        self.gate.finished(self.role_name)
        return reply


async def ids_of_a_run(order: list[str], seed: int) -> list[tuple[str, str, str]]:
    gate = Gate(order)
    team = Team(env=Environment(seed=seed, concurrency=8))
    team.hire([Role(name=name, actions=[Answer(gate)], send_to="nobody-listens") for name in sorted(order)])
    team.env.strict = False
    await team.run(1, idea="go")
    return [(m.sent_from, m.id, m.content) for m in team.env.history]


@settings(max_examples=20, deadline=None)
@given(st.permutations(["r0", "r1", "r2", "r3", "r4"]))
def test_ids_do_not_depend_on_which_role_finished_first(order):
    finishing_in_order = anyio.run(ids_of_a_run, sorted(order), 3)
    finishing_shuffled = anyio.run(ids_of_a_run, list(order), 3)
    assert finishing_shuffled == finishing_in_order


def test_another_seed_gives_other_ids_and_the_same_seed_the_same():
    same = anyio.run(ids_of_a_run, ["a", "b"], 1), anyio.run(ids_of_a_run, ["a", "b"], 1)
    other = anyio.run(ids_of_a_run, ["a", "b"], 2)
    assert same[0] == same[1]
    assert {i for _, i, _ in same[0]}.isdisjoint(i for _, i, _ in other)


async def test_a_saved_state_carries_the_id_key_to_where_it_is_loaded():
    env = Environment(seed=11)
    env.add_role(Role(name="r"))
    restored = Environment(seed=99)
    restored.add_role(Role(name="r"))
    restored.load_state(env.state_dict())
    assert restored.id_key == env.id_key == run_key(11)
    assert restored.roles["r"].ids is not None and restored.roles["r"].ids.key == run_key(11)
