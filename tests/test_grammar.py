"""The grammar of a structured answer carries the whole schema: every sentence it admits validates."""

from __future__ import annotations

import random
from typing import Any, Literal, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, create_model

from metaroles.llm.grammar import Node, Unsupported, int_range, pattern_grammar, sample, schema_grammar, to_gbnf

PATTERNS = [
    r"^[a-z]{2,5}$",
    r"^\d{3}-\d{4}$",
    r"^(yes|no|maybe)$",
    r"^[A-Z][a-z]+( [A-Z][a-z]+)*$",
    r"^[^,]{1,8}$",
    r"^v\d+\.\d+(\.\d+)?$",
    r'^[a-c"\\]+$',
    r"^\w+@\w+\.(com|org)$",
]

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False).map(lambda x: round(x, 3))


@st.composite
def number_field(draw: st.DrawFn, kind: type) -> tuple[Any, Any]:
    low = draw(st.none() | (st.integers(-(10**6), 10**6) if kind is int else finite))
    high = draw(st.none() | (st.integers(-(10**6), 10**6) if kind is int else finite))
    if low is not None and high is not None and low > high:
        low, high = high, low
    tight = low is not None and high is not None and high - low < 2  # strict bounds could leave nothing between
    constraints: dict[str, Any] = {}
    if low is not None:
        constraints["gt" if draw(st.booleans()) and not tight else "ge"] = low
    if high is not None:
        constraints["lt" if draw(st.booleans()) and not tight else "le"] = high
    return kind, Field(**constraints)


@st.composite
def string_field(draw: st.DrawFn) -> tuple[Any, Any]:
    if draw(st.booleans()):
        return str, Field(pattern=draw(st.sampled_from(PATTERNS)))
    low = draw(st.integers(0, 6))
    high = draw(st.none() | st.integers(low, low + 10))
    return str, Field(min_length=low, max_length=high)


def scalar_fields() -> st.SearchStrategy[tuple[Any, Any]]:
    return st.one_of(
        number_field(int),
        number_field(float),
        string_field(),
        st.just((bool, ...)),
        st.just((Literal["pro", "con", 'a "quoted" one'], ...)),
        st.just((Optional[int], None)),  # noqa: UP045 - the schema pydantic writes for it
    )


@st.composite
def models(draw: st.DrawFn, depth: int = 0) -> type[BaseModel]:
    count = draw(st.integers(1, 4))
    fields: dict[str, Any] = {}
    for index in range(count):
        choice = draw(st.integers(0, 5 if depth < 1 else 3))
        if choice == 4:
            item, _ = draw(scalar_fields())
            low = draw(st.integers(0, 3))
            fields[f"f{index}"] = (list[item], Field(min_length=low, max_length=draw(st.none() | st.integers(low, 5))))
        elif choice == 5:
            fields[f"f{index}"] = (draw(models(depth + 1)), ...)
        else:
            fields[f"f{index}"] = draw(scalar_fields())
    return create_model(f"M{depth}_{count}", **fields)


@settings(max_examples=150, deadline=None)
@given(model=models(), seed=st.integers(0, 2**32))
def test_every_sentence_of_a_schemas_grammar_validates_against_it(model: type[BaseModel], seed: int) -> None:
    root, rules = schema_grammar(model.model_json_schema())
    rng = random.Random(seed)
    for _ in range(25):
        text = sample(root, rules, rng)
        model.model_validate_json(text)  # raises if the grammar admitted a value the schema refuses


@settings(max_examples=300, deadline=None)
@given(low=st.integers(0, 10**7), span=st.integers(0, 10**7), seed=st.integers(0, 2**32))
def test_an_integer_range_admits_exactly_its_integers(low: int, span: int, seed: int) -> None:
    high = low + span
    node = int_range(low, high)
    rng = random.Random(seed)
    drawn = [sample(node, {}, rng) for _ in range(30)]
    assert all(low <= int(text) <= high and (text == "0" or not text.startswith("0")) for text in drawn), drawn


def test_the_bounds_a_small_model_broke_are_in_the_grammar() -> None:
    class Verdict(BaseModel):
        winner: Literal["pro", "con"]
        reasoning: str = Field(min_length=20, max_length=200)
        confidence: float = Field(ge=0.0, le=1.0)

    root, rules = schema_grammar(Verdict.model_json_schema())
    text = to_gbnf(root, rules)
    assert '"\\"pro\\"" | "\\"con\\""' in text and "{20,200}" in text
    assert '"-"' not in text, "no sign: a confidence below 0 cannot be written"
    rng = random.Random(0)
    confidences = [Verdict.model_validate_json(sample(root, rules, rng)).confidence for _ in range(300)]
    assert 0 <= min(confidences) < max(confidences) <= 1, "drawn within the bounds, and not one value only"


def _ends(node: Node, text: str, starts: set[int]) -> set[int]:
    """Where ``node`` can end in ``text`` when it starts at any of ``starts`` (no rules: a number's grammar)."""
    if node.kind == "lit":
        return {at + len(node.text) for at in starts if text.startswith(node.text, at)}
    if node.kind == "cls":
        inside = [at for at in starts if at < len(text) and any(a <= text[at] <= b for a, b in node.ranges)]
        return {at + 1 for at in inside} if not node.negated else set()
    if node.kind == "seq":
        for item in node.items:
            starts = _ends(item, text, starts)
        return starts
    if node.kind == "alt":
        return set().union(*(_ends(item, text, starts) for item in node.items))
    ends, reached = set(starts) if node.low == 0 else set(), set(starts)
    for count in range(1, (node.high if node.high is not None else len(text)) + 1):
        reached = _ends(node.items[0], text, reached)
        if count >= node.low:
            ends |= reached
    return ends


@pytest.mark.parametrize(
    ("bound", "refused", "admitted"),
    [
        ({"exclusiveMinimum": 32768.938}, ["32768.938", "32768.93800000000000001"], ["32768.9381", "40000"]),
        ({"exclusiveMaximum": 5}, ["5", "4.99999999999999999999"], ["4.9999", "-3.5"]),
        ({"exclusiveMinimum": 0}, ["0", "0.00000000000000000000", "-1"], ["0.00000000000000000001", "7"]),
    ],
)
def test_an_exclusive_float_bound_admits_no_decimal_that_reads_as_the_bound(
    bound: dict[str, float], refused: list[str], admitted: list[str]
) -> None:
    """A decimal just past an exclusive bound reads as the bound itself as a float: the grammar keeps it out."""
    root, _ = schema_grammar({"type": "number", **bound})
    assert [text for text in refused if len(text) in _ends(root, text, {0})] == []
    assert [text for text in admitted if len(text) not in _ends(root, text, {0})] == []


def test_what_the_grammar_cannot_carry_is_said() -> None:
    with pytest.raises(Unsupported):
        pattern_grammar(r"^(?=a)b$")
    with pytest.raises(Unsupported):
        schema_grammar({"type": "array", "items": {"type": "integer"}, "uniqueItems": True})
    with pytest.raises(Unsupported):
        schema_grammar({"type": "integer", "minimum": 3, "maximum": 2})
    with pytest.raises(Unsupported, match="more than the grammar spells out"):
        schema_grammar({"type": "string", "minLength": 5000})
    assert "{0,100000}" not in to_gbnf(*schema_grammar({"type": "string", "maxLength": 100_000})), "left to validation"
