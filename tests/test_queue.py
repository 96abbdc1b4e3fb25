import anyio
import pytest
from anyio import wait_all_tasks_blocked
from anyio.lowlevel import checkpoint
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from metaroles import Message, MessageQueue, PriorityMessageQueue


def test_fifo_push_pop_count_empty():
    q = MessageQueue()
    assert q.empty() and q.count() == 0 and q.pop() is None
    a, b = Message("a"), Message("b")
    assert q.push(a) and q.push(b)
    assert q.count() == 2 and not q.empty()
    assert q.pop() is a
    assert q.pop_all() == [b]
    assert q.empty()


def test_no_duplicate_ids():
    q = MessageQueue()
    a = Message("a")
    assert q.push(a)
    assert not q.push(Message("other text", id=a.id))
    assert q.count() == 1
    q.pop()
    assert q.push(a), "once popped, the same id may come again"


@pytest.mark.parametrize("queue_cls", [MessageQueue, PriorityMessageQueue])
async def test_get_waits_for_a_push(queue_cls):
    q = queue_cls()
    got: list[Message] = []

    async def consumer() -> None:
        got.append(await q.get())

    async with anyio.create_task_group() as tg:
        tg.start_soon(consumer)
        await wait_all_tasks_blocked()
        assert got == []
        msg = Message("wake")
        q.push(msg)
    assert got == [msg]
    assert q.empty()


async def test_wait_nonempty_returns_at_once_when_something_is_buffered():
    q = MessageQueue([Message("x")])
    with anyio.fail_after(5):
        await q.wait_nonempty()
    await checkpoint()
    assert q.count() == 1


def test_priority_order_is_by_priority_then_fifo():
    q = PriorityMessageQueue()
    q.push(Message("normal"), priority=5)
    q.push(Message("urgent"), priority=1)
    q.push(Message("low"), priority=10)
    q.push(Message("normal-2"), priority=5)
    q.push(Message("from-metadata", metadata={"priority": 0}))
    assert [q.pop().content for _ in range(5)] == ["from-metadata", "urgent", "normal", "normal-2", "low"]  # type: ignore[union-attr]


def test_queues_serialise_with_their_contents():
    q = MessageQueue([Message("a"), Message("b", send_to="x")])
    back = MessageQueue.load(q.dump())
    assert [m.model_dump() for m in back.peek_all()] == [m.model_dump() for m in q.peek_all()]
    p = PriorityMessageQueue()
    p.push(Message("late"), priority=9)
    p.push(Message("soon"), priority=1)
    restored = PriorityMessageQueue.load(p.dump())
    assert [m.content for m in restored.pop_all()] == ["soon", "late"]


class QueueMachine(RuleBasedStateMachine):
    """MessageQueue behaves like a list without duplicate ids."""

    def __init__(self) -> None:
        super().__init__()
        self.queue = MessageQueue()
        self.model: list[Message] = []
        self.seen: list[Message] = []

    @rule(new=st.booleans())
    def push(self, new: bool) -> None:
        msg = Message("m") if new or not self.seen else self.seen[-1]
        self.seen.append(msg)
        added = self.queue.push(msg)
        assert added == (msg.id not in {m.id for m in self.model})
        if added:
            self.model.append(msg)

    @precondition(lambda self: True)
    @rule()
    def pop(self) -> None:
        expected = self.model.pop(0) if self.model else None
        assert self.queue.pop() is expected

    @rule()
    def pop_all(self) -> None:
        assert self.queue.pop_all() == self.model
        self.model = []

    @invariant()
    def counts_match(self) -> None:
        assert self.queue.count() == len(self.model) == len(self.queue)
        assert self.queue.empty() == (not self.model)
        assert self.queue.peek_all() == self.model


TestQueueMachine = QueueMachine.TestCase


class PriorityMachine(RuleBasedStateMachine):
    """PriorityMessageQueue pops by (priority, arrival)."""

    def __init__(self) -> None:
        super().__init__()
        self.queue = PriorityMessageQueue()
        self.model: list[tuple[int, int, Message]] = []
        self.n = 0

    @rule(priority=st.integers(-3, 3))
    def push(self, priority: int) -> None:
        self.n += 1
        msg = Message(str(self.n))
        self.queue.push(msg, priority=priority)
        self.model.append((priority, self.n, msg))

    @rule()
    def pop(self) -> None:
        self.model.sort(key=lambda e: (e[0], e[1]))
        expected = self.model.pop(0)[2] if self.model else None
        assert self.queue.pop() is expected

    @invariant()
    def count(self) -> None:
        assert self.queue.count() == len(self.model)


TestPriorityMachine = PriorityMachine.TestCase


@pytest.mark.parametrize("queue_cls", [MessageQueue, PriorityMessageQueue])
def test_pop_all_empties_and_allows_reuse(queue_cls):
    q = queue_cls([Message("a"), Message("b")])
    assert len(q.pop_all()) == 2
    assert q.empty()
    assert q.push(Message("c"))
