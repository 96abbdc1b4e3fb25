from array import array
from collections.abc import Sequence
from typing import ClassVar

import anyio
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from metaroles import Action, ChatMemory, ChatRole, InvalidValueError, Memory, Message
from metaroles.messages.memory import POSITIONS


class WritePRD(Action):
    pass


class WriteCode(Action):
    pass


def test_add_is_idempotent_by_id():
    mem = Memory()
    msg = Message("a", cause_by=WritePRD)
    assert mem.add(msg)
    assert not mem.add(msg)
    assert not mem.add(Message("different", id=msg.id))
    assert mem.count() == 1 and len(mem.get_by_action(WritePRD)) == 1


def test_index_and_queries():
    prd = Message("the prd", cause_by=WritePRD, role="assistant", sent_from="pm")
    code = Message("the code", cause_by=WriteCode, role="assistant", sent_from="eng")
    user = Message("build a game")
    mem = Memory([user, prd, code])
    assert mem.get_by_action(WritePRD) == [prd]
    assert mem.get_by_action(WritePRD()) == [prd]
    assert mem.get_by_action("tests.test_memory.WritePRD") == [prd]
    assert mem.get_by_action(WriteCode) == [code]
    assert mem.get_by_actions([WriteCode, WritePRD]) == [prd, code]  # memory order, not argument order
    assert mem.get_by_role(ChatRole.ASSISTANT) == [prd, code]
    assert mem.get_by_role("user") == [user]
    assert mem.get_by_sender("eng") == [code]
    assert mem.get_by_content("the") == [prd, code]
    assert mem.try_remember("game") == [user]
    assert set(mem.index) == {WritePRD.action_id(), WriteCode.action_id(), user.cause_by}
    assert mem.get() == [user, prd, code]
    assert mem.get(2) == [prd, code]
    assert mem.storage == [user, prd, code]


def test_find_news_skips_what_is_remembered():
    old = [Message(str(i)) for i in range(5)]
    mem = Memory(old)
    new = [Message("n1"), Message("n2")]
    assert mem.find_news([*old, *new]) == new
    assert mem.find_news([old[0], old[4], new[0]], k=2) == [old[0], new[0]]


def test_delete_delete_newest_clear():
    a, b, c = Message("a", cause_by=WritePRD), Message("b", cause_by=WritePRD), Message("c")
    mem = Memory([a, b, c])
    assert mem.delete_newest() is c
    assert mem.delete(a)
    assert not mem.delete(a)
    assert mem.get() == [b] and mem.get_by_action(WritePRD) == [b]
    mem.clear()
    assert mem.count() == 0 and mem.get_by_action(WritePRD) == [] and not mem.index
    assert mem.delete_newest() is None


def test_ignore_id_deduplicates_by_content_without_mutating_messages():
    mem = Memory(ignore_id=True)
    a, twin = Message("same"), Message("same")
    assert mem.add(a)
    assert not mem.add(twin)
    assert a.id != twin.id, "messages keep their ids"
    assert mem.find_news([twin, Message("other")])[0].content == "other"


def test_memory_round_trips():
    mem = Memory([Message("a", cause_by=WritePRD), Message("b")])
    back = Memory.load(mem.dump())
    assert back.storage == mem.storage
    assert back.get_by_action(WritePRD)[0].content == "a"


messages = st.sampled_from(range(12))
actions = st.sampled_from([WritePRD, WriteCode, "x.Other"])


class MemoryMachine(RuleBasedStateMachine):
    """Memory behaves like an ordered list without duplicate ids, with a consistent index."""

    def __init__(self) -> None:
        super().__init__()
        self.pool: dict[int, Message] = {}
        self.memory = Memory()
        self.model: list[Message] = []
        self.views: list[tuple[Sequence[Message], list[Message]]] = []

    def message(self, n: int, action: object) -> Message:
        if n not in self.pool:
            self.pool[n] = Message(f"m{n}", cause_by=action)
        return self.pool[n]

    @rule(n=messages, action=actions)
    def add(self, n: int, action: object) -> None:
        msg = self.message(n, action)
        added = self.memory.add(msg)
        assert added == (msg not in self.model)
        if added:
            self.model.append(msg)

    @rule(count=st.integers(1, 90), action=actions)
    def add_many(self, count: int, action: object) -> None:
        """Enough at once that get_by_actions' kept merge folds its tail (past 64) into its body."""
        for i in range(count):
            msg = Message(f"bulk{i}", cause_by=action if i % 3 else WritePRD)
            assert self.memory.add(msg)
            self.model.append(msg)

    @rule(n=messages, action=actions)
    def delete(self, n: int, action: object) -> None:
        msg = self.message(n, action)
        assert self.memory.delete(msg) == (msg in self.model)
        if msg in self.model:
            self.model.remove(msg)

    @rule()
    def delete_newest(self) -> None:
        expected = self.model.pop() if self.model else None
        assert self.memory.delete_newest() is expected

    @rule(ns=st.lists(messages, max_size=6), k=st.integers(0, 8))
    def find_news(self, ns: list[int], k: int) -> None:
        observed = [self.message(n, WritePRD) for n in ns]
        window = self.model[-k:] if k else self.model
        assert self.memory.find_news(observed, k) == [m for m in observed if m not in window]

    @rule(k=st.integers(0, 8), action=actions)
    def take_views(self, k: int, action: object) -> None:
        """Views handed out are snapshots: later adds and removals never change what they show."""
        window = self.model[-k:] if k else list(self.model)
        cause = Message("", cause_by=action).cause_by
        self.views.append((self.memory.get(k), window))
        self.views.append((self.memory.get_by_action(action), [m for m in self.model if m.cause_by == cause]))
        both = {WritePRD.action_id(), cause}
        self.views.append(
            (self.memory.get_by_actions([WritePRD, action]), [m for m in self.model if m.cause_by in both])
        )

    @invariant()
    def views_are_snapshots(self) -> None:
        for view, expected in self.views:
            assert list(view) == expected and len(view) == len(expected)
            assert list(reversed(view)) == expected[::-1]
            assert [view[i] for i in range(-len(expected), len(expected))] == expected + expected
            assert view[1:-1] == expected[1:-1] and view[::2] == expected[::2] and view[-3:] == expected[-3:]

    @rule(ns=st.lists(messages, max_size=8), action=actions)
    def remember_new(self, ns: list[int], action: object) -> None:
        batch = [self.message(n, action) for n in ns]
        fresh = [m for at, m in enumerate(batch) if m not in self.model and m not in batch[:at]]
        assert self.memory.remember_new(batch) == fresh
        self.model += fresh

    @rule()
    def through_parts(self) -> None:
        """A memory sent as its parts (a shard's) is the same memory, index and all, and grows the same."""
        keys, items, index, edits = self.memory.parts()
        self.memory = Memory.from_parts(keys, list(items), {a: array(POSITIONS, b) for a, b in index.items()}, edits)

    @rule(action=actions)
    def index_stays_live(self, action: object) -> None:
        """The ``index`` mapping answers for what is remembered after it was handed out."""
        index = self.memory.index
        cause = Message("", cause_by=action).cause_by
        late = Message("late", cause_by=action)
        self.memory.add(late)
        self.model.append(late)
        assert list(index[cause]) == [m for m in self.model if m.cause_by == cause]
        assert (cause in index) == any(m.cause_by == cause for m in self.model)

    @rule()
    def dumped(self) -> None:
        """MetaGPT's dump holds the index (brought up to date, no view handed out: a removal then edits in place)."""
        index = self.memory.model_dump()["index"]
        causes = {m.cause_by for m in self.model}
        assert index == {c: [m.id for m in self.model if m.cause_by == c] for c in causes}

    @invariant()
    def in_order(self) -> None:
        assert list(self.memory) == self.model  # iterated, not viewed: a removal with no view out edits in place
        assert self.memory.count() == len(self.model)

    @rule()
    def consistent(self) -> None:
        """Read by action now and then, not after every step: the index is made at the first such read, then kept."""
        assert self.memory.get() == self.model
        for action in (WritePRD, WriteCode, "x.Other"):
            expected = [m for m in self.model if m.cause_by == Message("", cause_by=action).cause_by]
            assert self.memory.get_by_action(action) == expected
        assert self.memory.get_by_actions([WritePRD, WriteCode]) == [
            m for m in self.model if m.cause_by in {WritePRD.action_id(), WriteCode.action_id()}
        ]


TestMemoryMachine = MemoryMachine.TestCase


def test_chat_memory_window():
    mem = ChatMemory(max_messages=3)
    msgs = [Message(str(i)) for i in range(5)]
    for m in msgs[:2]:
        mem.add_message(m)
    assert mem.messages == msgs[:2]
    mem.add_messages(msgs[2:])
    assert mem.messages == msgs[2:], "add_messages honours the bound"
    assert mem.get_recent_messages(2) == msgs[3:]
    assert mem.get_recent_messages(0) == []
    assert mem.to_dict_list() == [{"role": "user", "content": str(i)} for i in (2, 3, 4)]
    mem.clear()
    assert mem.messages == [] and len(mem) == 0


@pytest.mark.parametrize("bad", [0, -1, 1.5, "10", True])
def test_chat_memory_rejects_bad_bounds(bad):
    with pytest.raises(InvalidValueError, match=r"max_messages=.* must be a positive integer"):
        ChatMemory(max_messages=bad)


@st.composite
def batches(draw: st.DrawFn) -> tuple[int, list[list[int]]]:
    return draw(st.integers(1, 5)), draw(st.lists(st.lists(st.integers(0, 50), max_size=8), max_size=6))


from hypothesis import given  # noqa: E402


@given(batches())
def test_chat_memory_keeps_the_newest_max_messages(case: tuple[int, list[list[int]]]) -> None:
    bound, groups = case
    mem = ChatMemory(max_messages=bound)
    everything: list[Message] = []
    for group in groups:
        batch = [Message(str(n)) for n in group]
        everything.extend(batch)
        mem.add_messages(batch)
        assert len(mem) <= bound
    assert mem.messages == everything[-bound:] if everything else mem.messages == []


class _Said(Action):
    pass


@given(
    st.lists(st.tuples(st.integers(0, 12), st.sampled_from(["a", "b", "me"]), st.booleans()), max_size=30),
    st.booleans(),
)
def test_remember_news_is_remember_new_then_the_watch_filter(rows: list[tuple[int, str, bool]], by_content: bool):
    """One pass gives what two give: the new messages counted, the watched or addressed ones kept, in order."""
    pool = [Message(str(i), cause_by=_Said if i % 3 == 0 else None, send_to=to) for i, to, _ in rows]
    pool += [pool[i] for i, (_, _, again) in enumerate(rows) if again]  # deliveries of a message already held
    watch = {Message("x", cause_by=_Said).cause_by}
    one, two = Memory(ignore_id=by_content), Memory(ignore_id=by_content)
    count, news = one.remember_news(pool, watch, "me")
    new = two.remember_new(pool)
    assert count == len(new) and one.storage == two.storage
    assert news == [m for m in new if m.cause_by in watch or "me" in m.send_to]


class Keep(Action):
    """Keeps the history each act was handed."""

    seen: ClassVar[list[Sequence[Message]]] = []

    async def run(self, history: Sequence[Message]) -> str:
        Keep.seen.append(history)
        return f"reply {len(history)}"


def test_an_action_gets_a_read_only_snapshot_of_its_roles_memory() -> None:
    from metaroles import Environment, Role

    Keep.seen = []
    env = Environment()
    env.add_role(Role(name="a", actions=[Keep], watch=[Keep], send_to="b"))
    env.add_role(Role(name="b", actions=[Keep], watch=[Keep], send_to="a"))  # a and b answer each other
    env.publish_message(Message("go", send_to="a"))
    anyio.run(env.run, 6)
    a_seen = Keep.seen[::2]  # a acts in rounds 1, 3, 5; b in 2, 4, 6
    assert [len(h) for h in a_seen] == [1, 3, 5], "what was remembered at each act, nothing added since"
    first, last = a_seen[0], a_seen[-1]
    assert [m.content for m in first] == ["go"]
    assert [m.content for m in last] == ["go", "reply 1", "reply 1", "reply 3", "reply 3"]
    assert last == env.roles["a"].rc.memory.get()[:5] and last.__add__([first[0]]) == [*last, first[0]]
    with pytest.raises(AttributeError):
        last.append(first[0])  # type: ignore[attr-defined]
    with pytest.raises(IndexError, match="out of range for a view of 5 messages"):
        last[5]


def test_views_iterate_as_snapshots_while_the_memory_grows():
    """Adding to a memory while iterating one of its views (either way) does not reach the loop."""
    memory = Memory([Message(f"m{i}", cause_by=WritePRD) for i in range(3)])
    for view in (memory.get(), memory.get_by_action(WritePRD)):
        seen = []
        for message in view:
            seen.append(message.content)
            memory.add(Message(f"during {message.content}", cause_by=WritePRD))
            if len(seen) > 3:
                break  # the loop reached what it added: it would never end
        assert seen == ["m0", "m1", "m2"]
        newest_first = []
        for message in reversed(view):
            newest_first.append(message.content)
            memory.add(Message("later", cause_by=WritePRD))
        assert newest_first == ["m2", "m1", "m0"]


class _Touched(list):  # type: ignore[type-arg]
    """A list that counts the items read from it (by iteration or by index)."""

    touched = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        for item in super().__iter__():
            _Touched.touched += 1
            yield item

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        _Touched.touched += 1
        return super().__getitem__(index)


def test_iterating_the_newest_messages_reads_only_them_however_long_the_history():
    """A view of a round's new messages at the end of a long history costs those messages, not the history."""
    from metaroles.messages.view import MessageView

    items = _Touched(Message(f"m{i}") for i in range(100_000))
    _Touched.touched = 0
    assert [m.content for m in MessageView(items, 99_997)] == ["m99997", "m99998", "m99999"]
    assert _Touched.touched <= 3, f"{_Touched.touched} messages read to iterate three"
    _Touched.touched = 0
    assert [m.content for m in reversed(MessageView(items, 99_998))] == ["m99999", "m99998"]
    assert _Touched.touched <= 2


@given(size=st.integers(0, 40), k=st.integers(-2, 45), added=st.integers(0, 3))
def test_the_newest_k_iterate_as_the_list_s_tail_and_stay_a_snapshot(size: int, k: int, added: int) -> None:
    memory = Memory([Message(f"m{i}") for i in range(size)])
    view = memory.get(k)
    expected = list(memory)[-k:] if 0 < k < size else list(memory)
    for i in range(added):
        memory.add(Message(f"later {i}"))
    assert list(view) == expected and list(reversed(view)) == expected[::-1] and len(view) == len(expected)
