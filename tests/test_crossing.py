"""A shard's outboxes cross to the driver as columns, each set of recipients sent once, and come back equal."""

import pickle
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from metaroles import Message
from metaroles.core.exceptions import RunError
from metaroles.sharding.crossing import OutboxReader, OutboxWriter


class Verdict(BaseModel):
    winner: str


NAMES = st.sampled_from(["a0", "a1", "a2", "a3", "Judge", "<all>"])
MESSAGES = st.builds(
    lambda content, sender, to, role, odd: Message(
        content,
        sent_from=sender,
        send_to=to,
        role=role,
        cause_by="scenarios.society.Speak",
        **({"instruct_content": Verdict(winner=sender)} if odd == 1 else {"metadata": {"k": 1}} if odd == 2 else {}),
    ),
    content=st.text(max_size=20),
    sender=NAMES,
    to=st.frozensets(NAMES, min_size=1, max_size=3),
    role=st.sampled_from(["user", "assistant", "system"]),
    odd=st.sampled_from([0, 0, 0, 1, 2]),
)
SAID = [([],), (["m1"],), (["m1", "m2"],)]
"""What a sender says of its messages (``bus.record.SAID``: its ``caused_by``), one tuple shared by them."""
OUTBOX = st.lists(
    st.tuples(st.integers(0, 10**6), MESSAGES, st.sampled_from([0, 1, 2]), st.sampled_from(SAID)), max_size=12
)


@settings(max_examples=80, deadline=None)
@given(batches=st.lists(OUTBOX, min_size=1, max_size=4))
def test_outboxes_cross_equal_in_order_and_each_set_of_recipients_once(batches):
    writer, reader = OutboxWriter(), OutboxReader()
    sent_sets: list[frozenset[str]] = []
    for outbox in batches:
        columns = pickle.loads(pickle.dumps(writer.columns(outbox), 5))  # as it crosses
        sent_sets += columns[1]
        back = reader.outbox(columns)
        assert [(r, f, s) for r, _, f, s in back] == [(r, f, s) for r, _, f, s in outbox]  # with what was said
        assert [m.__reduce__()[1] for _, m, _, _ in back] == [m.__reduce__()[1] for _, m, _, _ in outbox]  # every field
        assert [m.instruct_content for _, m, _, _ in back] == [m.instruct_content for _, m, _, _ in outbox]
        shared = {id(c): id(b) for (*_, c), (*_, b) in zip(outbox, back, strict=True)}
        assert len(set(shared.values())) == len(shared), "what a sender said of its messages arrives as one object"
    assert len(sent_sets) == len(set(sent_sets)), "a set of recipients is sent once, whatever the rounds"
    plain = [m for outbox in batches for _, m, _, _ in outbox if m.instruct_content is None and not m._metadata]
    assert {m._send_to for m in plain} == set(sent_sets)


def test_the_same_recipients_become_one_object_on_the_driver():
    writer, reader = OutboxWriter(), OutboxReader()
    rounds = [[(n, Message(f"r{r}", sent_from="a0", send_to={"a1", "a2"}), 0, ([],))] for n, r in enumerate(range(3))]
    back = [reader.outbox(pickle.loads(pickle.dumps(writer.columns(o)))) for o in rounds]
    assert back[0][0][1]._send_to is back[2][0][1]._send_to
    assert back[2][0][1].send_to == frozenset({"a1", "a2"}) and back[2][0][1].content == "r2"


def test_a_set_of_recipients_takes_no_more_room_on_the_driver_than_where_it_was_made():
    writer, reader = OutboxWriter(), OutboxReader()
    message = Message("0.5", sent_from="a0", send_to={f"a{n}" for n in range(1, 7)})  # a society's six neighbours
    (back,) = reader.outbox(pickle.loads(pickle.dumps(writer.columns([(0, message, 0, ([],))]), 5)))
    assert back[1].send_to == message.send_to
    assert sys.getsizeof(back[1].send_to) <= sys.getsizeof(message.send_to)


def test_a_sender_and_an_action_arrive_as_one_string_whatever_the_batch():
    writer, reader = OutboxWriter(), OutboxReader()
    read = []
    for n in range(3):  # each batch pickled on its own, as a shard sends a round: new strings each time
        columns = writer.columns([(n, Message(f"{n}", sent_from="a7", send_to={"a1"}, cause_by="x.Speak"), 0, ([],))])
        read += [message for _, message, _, _ in reader.outbox(pickle.loads(pickle.dumps(columns)))]
    assert [m.content for m in read] == ["0", "1", "2"]
    assert all(m.sent_from == "a7" and m.sent_from is read[0].sent_from for m in read)
    assert all(m.cause_by == "x.Speak" and m.cause_by is read[0].cause_by for m in read)


def test_a_batch_read_out_of_order_is_refused():
    writer, reader = OutboxWriter(), OutboxReader()
    first = writer.columns([(0, Message("x", sent_from="a0", send_to={"a1"}), 0, ([],))])
    second = writer.columns([(1, Message("y", sent_from="a1", send_to={"a2"}), 0, ([],))])
    with pytest.raises(RunError, match="outbox 2 of a shard arrived after 0"):
        reader.outbox(second)
    assert reader.outbox(first)[0][1].content == "x"


def test_a_batch_of_plain_messages_comes_back_with_every_field_as_it_left():
    writer, reader = OutboxWriter(), OutboxReader()
    said = [Message(f"{n}", sent_from=f"a{n % 3}", send_to={f"a{n % 2}"}, role="assistant") for n in range(9)]
    outbox = [(n, message, n % 3, ([f"m{n}"],)) for n, message in enumerate(said)]
    back = reader.outbox(pickle.loads(pickle.dumps(writer.columns(outbox), 5)))
    assert [(r, f, c) for r, _, f, c in back] == [(r, f, c) for r, _, f, c in outbox]
    fields = Message.__slots__
    for (_, message, _, _), (_, sent, _, _) in zip(back, outbox, strict=True):
        assert [getattr(message, field) for field in fields] == [getattr(sent, field) for field in fields]


def test_columns_of_different_lengths_are_refused():
    from metaroles.messages.message import plain_messages

    with pytest.raises(ValueError, match=r"columns of \[2, 1, 2, 2, 2, 2\] values"):
        columns = (["i", "j"], ["x"], ["user", "user"], ["c", "c"], ["s", "s"], [frozenset(), frozenset()])
        plain_messages(Message, columns)
