"""JSON Schema → GBNF: a grammar whose every sentence validates against the schema.

The embedded model decodes a structured answer under a grammar (llama.cpp's GBNF). A grammar
that carries only the schema's shape lets a small model write ``"confidence": -3`` where the
output model says ``ge=0``: the answer then fails validation and the action fails. This grammar
carries the whole of what pydantic writes into a schema:

- numbers and integers within ``minimum``/``maximum`` (inclusive or exclusive), as digit ranges
  (a bounded float is written without an exponent);
- strings within ``minLength``/``maxLength``, matching a ``pattern`` (the regular-expression
  subset schemas use: literals, classes, groups, alternation, quantifiers), or of a ``format``
  (date, time, date-time, uuid);
- ``enum`` and ``const`` of any JSON values, booleans, null;
- arrays within ``minItems``/``maxItems``; objects with their properties in order (every
  property is written, so ``required`` holds), and maps (``additionalProperties``);
- ``anyOf``/``oneOf``, ``allOf`` of one schema, ``$ref`` into ``$defs`` (recursion included).

A bound past :data:`MAX_REPEAT` (a ``maxLength`` of 10,000, say) is left to the validation after
decoding: llama.cpp would spell the repeat out as that many rules.

The grammar is built as a small tree (:class:`Node`), rendered with :func:`to_gbnf`; the same
tree draws sentences (:func:`sample`), which is how the tests check the claim over generated
schemas. A keyword it cannot honour (``uniqueItems``, ``multipleOf``, a regular expression with
look-arounds) raises :class:`Unsupported`, and the caller decodes without it and validates after.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

__all__ = ["Node", "Unsupported", "sample", "schema_grammar", "to_gbnf"]

MAX_DIGITS = 15
"""Digits an integer part may have where the schema sets no bound."""
MAX_REPEAT = 1000
"""The longest counted repeat (a string's length, an array's items) the grammar spells out."""
MAX_FRACTION = 20
"""Digits a fraction may have (a float's shortest form has at most 17 significant ones)."""


class Unsupported(ValueError):
    """A schema keyword the grammar cannot carry (the answer is validated after decoding instead)."""


@dataclass(frozen=True, slots=True)
class Node:
    """A grammar expression: a literal, a character class, a sequence, a choice, a repeat or a rule's name.

    ``kind`` is one of ``lit`` (``text``), ``cls`` (``ranges``, ``negated``), ``seq`` and ``alt``
    (``items``), ``rep`` (``items[0]`` from ``low`` to ``high`` times, ``high`` ``None``: unbounded)
    and ``ref`` (``text`` names a rule).
    """

    kind: str
    text: str = ""
    items: tuple[Node, ...] = ()
    ranges: tuple[tuple[str, str], ...] = ()
    negated: bool = False
    low: int = 0
    high: int | None = None


def lit(text: str) -> Node:
    """The literal ``text``."""
    return Node("lit", text=text)


def cls(*ranges: tuple[str, str], negated: bool = False) -> Node:
    """A character class of inclusive ``ranges`` (or every character outside them)."""
    return Node("cls", ranges=tuple(ranges), negated=negated)


def seq(*items: Node) -> Node:
    """``items`` one after another."""
    flat = tuple(i for item in items for i in (item.items if item.kind == "seq" else (item,)))
    return flat[0] if len(flat) == 1 else Node("seq", items=flat)


def alt(*items: Node) -> Node:
    """One of ``items``."""
    return items[0] if len(items) == 1 else Node("alt", items=tuple(items))


def rep(item: Node, low: int, high: int | None) -> Node:
    """``item`` from ``low`` to ``high`` times (``None``: no upper bound).

    llama.cpp spells a counted repeat out as that many rules: past :data:`MAX_REPEAT` the upper
    bound is left to the validation after decoding, and a lower bound that large is refused.

    Raises:
        Unsupported: If ``low`` is over :data:`MAX_REPEAT`.
    """
    if low > MAX_REPEAT:
        raise Unsupported(f"a repeat of at least {low} is more than the grammar spells out ({MAX_REPEAT})")
    return Node("rep", items=(item,), low=low, high=None if high is not None and high > MAX_REPEAT else high)


EMPTY = lit("")
DIGIT = cls(("0", "9"))
WS = rep(lit(" "), 0, 1)
STRING_CHAR = alt(
    cls(('"', '"'), ("\\", "\\"), ("\x00", "\x1f"), ("\x7f", "\x7f"), negated=True),
    seq(
        lit("\\"), cls(('"', '"'), ("\\", "\\"), ("/", "/"), ("b", "b"), ("f", "f"), ("n", "n"), ("r", "r"), ("t", "t"))
    ),
)


# -- the schema's tree ----------------------------------------------------------------------------


def schema_grammar(schema: dict[str, Any]) -> tuple[Node, dict[str, Node]]:
    """The grammar of ``schema``: its root expression and its named rules (one per ``$defs`` entry).

    Raises:
        Unsupported: On a keyword the grammar cannot carry, or a schema no value satisfies.
    """
    defs = schema.get("$defs", {})
    rules: dict[str, Node] = {}
    for name, definition in defs.items():
        rules[_rule_name(name)] = _value(definition, defs)
    return _value(schema, defs), rules


def _rule_name(name: str) -> str:
    return "def-" + re.sub(r"[^A-Za-z0-9]", "-", name)


def _value(schema: dict[str, Any] | bool, defs: dict[str, Any]) -> Node:
    if schema is True or schema == {}:
        return Node("ref", text="any-value")
    if schema is False:
        raise Unsupported("a schema of false admits no value")
    for word in ("uniqueItems", "multipleOf", "not", "if", "patternProperties", "dependentRequired"):
        if word in schema:
            raise Unsupported(f"the grammar cannot carry {word!r}")
    combined = _combined(schema, defs)
    if combined is not None:
        return combined
    kind = schema.get("type")
    if isinstance(kind, list):
        return alt(*(_value({**schema, "type": one}, defs) for one in kind))
    maker = _TYPES.get(str(kind))
    if maker is None:
        return _object(schema, defs) if "properties" in schema else Node("ref", text="any-value")
    return maker(schema, defs)


def _combined(schema: dict[str, Any], defs: dict[str, Any]) -> Node | None:
    """The grammar of a reference, a constant, an enum or a union; ``None`` for a schema of a type."""
    if "$ref" in schema:
        name = str(schema["$ref"]).removeprefix("#/$defs/")
        if name not in defs:
            raise Unsupported(f"$ref {schema['$ref']!r} is not in $defs")
        return Node("ref", text=_rule_name(name))
    if "const" in schema:
        return lit(json.dumps(schema["const"]))
    if "enum" in schema:
        return alt(*(lit(json.dumps(value)) for value in schema["enum"]))
    for word in ("anyOf", "oneOf"):
        if word in schema:
            return alt(*(_value(option, defs) for option in schema[word]))
    if "allOf" in schema:
        if len(schema["allOf"]) != 1:
            raise Unsupported("the grammar carries allOf of one schema only")
        return _value(schema["allOf"][0], defs)
    return None


def _object(schema: dict[str, Any], defs: dict[str, Any]) -> Node:
    properties: dict[str, Any] = schema.get("properties", {})
    if properties:
        pairs = [seq(lit(json.dumps(name)), WS, lit(":"), WS, _value(sub, defs)) for name, sub in properties.items()]
        body: list[Node] = [pairs[0]]
        for pair in pairs[1:]:
            body += [lit(","), WS, pair]
        return seq(lit("{"), WS, *body, WS, lit("}"))
    extra = schema.get("additionalProperties", {})
    if extra is False:
        return lit("{}")
    low, high = int(schema.get("minProperties", 0)), schema.get("maxProperties")
    pair = seq(_string({}, defs), WS, lit(":"), WS, _value(extra if isinstance(extra, dict) else {}, defs))
    return seq(lit("{"), WS, _items(pair, low, high), WS, lit("}"))


def _items(item: Node, low: int, high: int | None) -> Node:
    """``low`` to ``high`` ``item``s separated by commas."""
    if high is not None and high < low:
        raise Unsupported(f"at least {low} and at most {high} items admit none")
    if high == 0:
        return EMPTY
    more = rep(seq(lit(","), WS, item), max(low - 1, 0), None if high is None else high - 1)
    some = seq(item, more)
    return some if low > 0 else alt(EMPTY, some)


def _array(schema: dict[str, Any], defs: dict[str, Any]) -> Node:
    if "prefixItems" in schema:
        raise Unsupported("the grammar cannot carry prefixItems (tuples)")
    item = _value(schema.get("items", {}), defs)
    low, high = int(schema.get("minItems", 0)), schema.get("maxItems")
    return seq(lit("["), WS, _items(item, low, None if high is None else int(high)), WS, lit("]"))


def _string(schema: dict[str, Any], defs: dict[str, Any]) -> Node:
    if "pattern" in schema:
        return seq(lit('"'), pattern_grammar(str(schema["pattern"])), lit('"'))
    fmt = _FORMATS.get(str(schema.get("format", "")))
    if fmt is not None:
        return seq(lit('"'), fmt, lit('"'))
    low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
    if high is not None and int(high) < low:
        raise Unsupported(f"minLength {low} > maxLength {high}")
    return seq(lit('"'), rep(STRING_CHAR, low, None if high is None else int(high)), lit('"'))


def _boolean(schema: dict[str, Any], defs: dict[str, Any]) -> Node:
    return alt(lit("true"), lit("false"))


def _null(schema: dict[str, Any], defs: dict[str, Any]) -> Node:
    return lit("null")


def _integer(schema: dict[str, Any], defs: dict[str, Any]) -> Node:
    low, high = _bounds(schema)
    low_int = None if low is None else int(_ceil(low[0]) + (1 if not low[1] and low[0] == _ceil(low[0]) else 0))
    high_int = None if high is None else int(_floor(high[0]) - (1 if not high[1] and high[0] == _floor(high[0]) else 0))
    if low_int is not None and high_int is not None and low_int > high_int:
        raise Unsupported(f"no integer lies between {low_int} and {high_int}")
    options = []
    if low_int is None or low_int < 0:  # the negative part: -(1 .. -low)
        top = None if low_int is None else -low_int
        bottom = 1 if high_int is None or high_int >= 0 else -high_int
        options.append(seq(lit("-"), int_range(bottom, top)))
    if high_int is None or high_int >= 0:
        options.append(int_range(max(low_int or 0, 0), high_int))
    return alt(*options)


def _number(schema: dict[str, Any], defs: dict[str, Any]) -> Node:
    low, high = (_as_float_bound(bound, up) for bound, up in zip(_bounds(schema), (True, False), strict=True))
    if low is None and high is None:
        fraction = seq(lit("."), rep(DIGIT, 1, MAX_FRACTION))
        exponent = seq(cls(("e", "e"), ("E", "E")), rep(cls(("-", "-"), ("+", "+")), 0, 1), rep(DIGIT, 1, 3))
        return seq(rep(lit("-"), 0, 1), int_range(0, None), rep(fraction, 0, 1), rep(exponent, 0, 1))
    if low is not None and high is not None and (low[0] > high[0] or (low[0] == high[0] and not (low[1] and high[1]))):
        raise Unsupported(f"no number lies between {low[0]} and {high[0]}")
    options = []
    if low is None or low[0] < 0:  # v = -w, w > 0
        w_high = None if low is None else (-low[0], low[1])
        w_low = (Decimal(0), False) if high is None or high[0] >= 0 else (-high[0], high[1])
        negative = _magnitude(w_low, w_high)
        if negative is not None:
            options.append(seq(lit("-"), negative))
    if high is None or high[0] >= 0:
        start = low if low is not None and low[0] >= 0 else (Decimal(0), True)
        positive = _magnitude(start, high)
        if positive is not None:
            options.append(positive)
    if not options:
        raise Unsupported(f"no number satisfies {schema!r}")
    return alt(*options)


Bound = tuple[Decimal, bool]
"""A bound's value and whether it is inclusive."""


def _bounds(schema: dict[str, Any]) -> tuple[Bound | None, Bound | None]:
    low: Bound | None = None
    high: Bound | None = None
    if "minimum" in schema:
        low = (_decimal(schema["minimum"]), True)
    if "exclusiveMinimum" in schema:
        value = _decimal(schema["exclusiveMinimum"])
        low = (value, False) if low is None or value >= low[0] else low
    if "maximum" in schema:
        high = (_decimal(schema["maximum"]), True)
    if "exclusiveMaximum" in schema:
        value = _decimal(schema["exclusiveMaximum"])
        high = (value, False) if high is None or value <= high[0] else high
    return low, high


def _as_float_bound(bound: Bound | None, up: bool) -> Bound | None:
    """An exclusive bound as the inclusive one a float check needs: the next float past it (``up``: above it).

    The answer is read as a float: a decimal just past the bound (``32768.93800000000000001``) reads
    as the bound itself, which an exclusive bound refuses.
    """
    if bound is None or bound[1]:
        return bound
    value = float(bound[0])
    return _decimal(math.nextafter(value, math.inf if up else -math.inf)), True


def _decimal(value: Any) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Unsupported(f"bound {value!r} is not a number")
    number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    if not number.is_finite():
        raise Unsupported(f"bound {value!r} is not finite")
    return number


def _floor(value: Decimal) -> Decimal:
    return value.to_integral_value(rounding="ROUND_FLOOR")


def _ceil(value: Decimal) -> Decimal:
    return value.to_integral_value(rounding="ROUND_CEILING")


def _fraction_digits(value: Decimal) -> str:
    """The digits after the point of a non-negative ``value``, trailing zeros dropped."""
    text = format(value - _floor(value), "f")
    return text.partition(".")[2].rstrip("0")


def _magnitude(low: Bound, high: Bound | None) -> Node | None:
    """Non-negative numbers from ``low`` to ``high`` written ``I(.F)?``; ``None`` if there are none."""
    a_int, a_frac = int(_floor(low[0])), (_fraction_digits(low[0]), low[1])
    if high is None:
        options = [_with_fraction(lit(str(a_int)), a_frac, None), seq(int_range(a_int + 1, None), _any_fraction())]
        return alt(*(o for o in options if o is not None))
    b_int, b_frac = int(_floor(high[0])), (_fraction_digits(high[0]), high[1])
    if a_int == b_int:
        return _with_fraction(lit(str(a_int)), a_frac, b_frac)
    options = [_with_fraction(lit(str(a_int)), a_frac, None)]
    if b_int - a_int > 1:
        options.append(seq(int_range(a_int + 1, b_int - 1), _any_fraction()))
    options.append(_with_fraction(lit(str(b_int)), None, b_frac))
    kept = [o for o in options if o is not None]
    return alt(*kept) if kept else None


def _any_fraction() -> Node:
    return rep(seq(lit("."), rep(DIGIT, 1, MAX_FRACTION)), 0, 1)


def _with_fraction(whole: Node, low: tuple[str, bool] | None, high: tuple[str, bool] | None) -> Node | None:
    """``whole`` followed by a fraction (or none) whose value lies between ``low`` and ``high``."""
    options = []
    if _zero_fits(low, high):
        options.append(whole)
    digits = _digits(low, high, MAX_FRACTION)
    if digits is not None:
        options.append(seq(whole, lit("."), digits))
    return alt(*options) if options else None


def _zero_fits(low: tuple[str, bool] | None, high: tuple[str, bool] | None) -> bool:
    """Whether a fraction that is all zeros (or none) lies between ``low`` and ``high``."""
    low_ok = low is None or (low[0] == "" and low[1])
    high_ok = high is None or high[0] != "" or high[1]
    return low_ok and high_ok


def _digits(low: tuple[str, bool] | None, high: tuple[str, bool] | None, room: int) -> Node | None:
    """One or more (at most ``room``) fraction digits whose value lies between ``low`` and ``high``."""
    if room <= 0:
        return None
    if low is None and high is None:
        return rep(DIGIT, 1, room)
    groups: dict[tuple[Any, Any], list[int]] = {}
    for digit in range(10):
        step = _step(digit, low, high)
        if step is not None:
            groups.setdefault(step, []).append(digit)
    options = []
    for (next_low, next_high), chosen in groups.items():
        first = _digit_class(chosen)
        rest = [] if not _zero_fits(next_low, next_high) else [EMPTY]
        more = _digits(next_low, next_high, room - 1)
        if more is not None:
            rest.append(more)
        if rest:
            options.append(seq(first, alt(*rest)))
    return alt(*options) if options else None


def _step(
    digit: int, low: tuple[str, bool] | None, high: tuple[str, bool] | None
) -> tuple[tuple[str, bool] | None, tuple[str, bool] | None] | None:
    """The bounds on the digits after ``digit``, or ``None`` if ``digit`` already breaks one."""
    next_low: tuple[str, bool] | None = None
    if low is not None:
        first = int(low[0][0]) if low[0] else 0
        if digit < first:
            return None
        if digit == first:
            next_low = (low[0][1:], low[1])
    next_high: tuple[str, bool] | None = None
    if high is not None:
        first = int(high[0][0]) if high[0] else 0
        if digit > first:
            return None
        if digit == first:
            next_high = (high[0][1:], high[1])
    return next_low, next_high


def _digit_class(digits: list[int]) -> Node:
    runs: list[tuple[str, str]] = []
    for digit in digits:
        if runs and int(runs[-1][1]) == digit - 1:
            runs[-1] = (runs[-1][0], str(digit))
        else:
            runs.append((str(digit), str(digit)))
    return cls(*runs)


def int_range(low: int, high: int | None) -> Node:
    """Non-negative integers from ``low`` to ``high``, no leading zeros (``None``: up to :data:`MAX_DIGITS` digits)."""
    if high is None:
        widest = max(len(str(low)), MAX_DIGITS)
        longer = seq(cls(("1", "9")), rep(DIGIT, len(str(low)), widest - 1)) if len(str(low)) < widest else None
        same = int_range(low, 10 ** len(str(low)) - 1)
        return alt(same, longer) if longer is not None else same
    if high < low:
        raise Unsupported(f"no integer lies between {low} and {high}")
    options = []
    for width in range(len(str(low)), len(str(high)) + 1):
        start = max(low, 0 if width == 1 else 10 ** (width - 1))
        end = min(high, 10**width - 1)
        if start <= end:
            options.append(_same_width(str(start), str(end)))
    return alt(*options)


def _same_width(low: str, high: str) -> Node:
    """Digit strings of one width from ``low`` to ``high``."""
    if len(low) == 1:
        return cls((low, high))
    if low[0] == high[0]:
        return seq(lit(low[0]), _same_width(low[1:], high[1:]))
    rest = len(low) - 1
    if low[1:] == "0" * rest and high[1:] == "9" * rest:
        return seq(cls((low[0], high[0])), rep(DIGIT, rest, rest))
    options = [seq(lit(low[0]), _same_width(low[1:], "9" * rest))]
    if int(high[0]) - int(low[0]) > 1:
        options.append(seq(cls((str(int(low[0]) + 1), str(int(high[0]) - 1))), rep(DIGIT, rest, rest)))
    options.append(seq(lit(high[0]), _same_width("0" * rest, high[1:])))
    return alt(*options)


def _two(low: int, high: int) -> Node:
    return _same_width(f"{low:02d}", f"{high:02d}")


_DATE = seq(rep(DIGIT, 4, 4), lit("-"), _two(1, 12), lit("-"), _two(1, 28))
_TIME = seq(_two(0, 23), lit(":"), _two(0, 59), lit(":"), _two(0, 59), rep(seq(lit("."), rep(DIGIT, 1, 6)), 0, 1))
_HEX = cls(("0", "9"), ("a", "f"))
_FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": seq(_DATE, lit("T"), _TIME, lit("Z")),
    "uuid": seq(*(seq(rep(_HEX, n, n), lit("-")) for n in (8, 4, 4, 4)), rep(_HEX, 12, 12)),
}
_TYPES = {
    "object": _object,
    "array": _array,
    "string": _string,
    "boolean": _boolean,
    "null": _null,
    "integer": _integer,
    "number": _number,
}


# -- regular expressions (the subset schemas use) -------------------------------------------------

_CLASS_ESCAPES = {
    "d": ((("0", "9"),), False),
    "w": ((("a", "z"), ("A", "Z"), ("0", "9"), ("_", "_")), False),
    "s": (((" ", " "), ("\t", "\t"), ("\n", "\n"), ("\r", "\r")), False),
    "D": ((("0", "9"),), True),
    "W": ((("a", "z"), ("A", "Z"), ("0", "9"), ("_", "_")), True),
    "S": (((" ", " "), ("\t", "\t"), ("\n", "\n"), ("\r", "\r")), True),
}
_PLAIN_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}
_UNSAFE = (('"', '"'), ("\\", "\\"), ("\x00", "\x1f"), ("\x7f", "\x7f"))
"""Characters a JSON string cannot hold as themselves (a pattern's class leaves them out)."""


def pattern_grammar(pattern: str) -> Node:
    """The JSON string contents (between the quotes) that match ``pattern`` whole.

    Raises:
        Unsupported: On regular-expression features beyond literals, classes, groups,
            alternation and quantifiers.
    """
    body = pattern.removeprefix("^")
    if body.endswith("$") and not body.endswith("\\$"):
        body = body[:-1]
    node, end = _alternation(body, 0)
    if end != len(body):
        raise Unsupported(f"pattern {pattern!r}: unexpected {body[end]!r} at {end}")
    return node


def _alternation(text: str, at: int) -> tuple[Node, int]:
    options = []
    node, at = _sequence(text, at)
    options.append(node)
    while at < len(text) and text[at] == "|":
        node, at = _sequence(text, at + 1)
        options.append(node)
    return alt(*options), at


def _sequence(text: str, at: int) -> tuple[Node, int]:
    items: list[Node] = []
    while at < len(text) and text[at] not in "|)":
        atom, at = _atom(text, at)
        atom, at = _quantified(atom, text, at)
        items.append(atom)
    return (seq(*items) if items else EMPTY), at


def _atom(text: str, at: int) -> tuple[Node, int]:
    char = text[at]
    if char == "(":
        if text.startswith("(?:", at):
            at += 2
        elif text.startswith("(?", at):
            raise Unsupported(f"the grammar cannot carry the group {text[at : at + 3]!r}")
        node, at = _alternation(text, at + 1)
        if at >= len(text) or text[at] != ")":
            raise Unsupported("an unclosed group")
        return node, at + 1
    if char == "[":
        return _class(text, at + 1)
    if char == ".":
        return cls(*_UNSAFE, ("\n", "\n"), negated=True), at + 1
    if char == "\\":
        return _escaped(text, at + 1)
    if char in "*+?{":
        raise Unsupported(f"a quantifier {char!r} with nothing before it")
    if char in "^$":
        raise Unsupported(f"an anchor {char!r} inside the pattern")
    return _char(char), at + 1


def _escaped(text: str, at: int) -> tuple[Node, int]:
    """The atom of the escape whose letter is at ``at`` (a class such as d, or a character such as n)."""
    if at >= len(text):
        raise Unsupported("a pattern ending in a backslash")
    escape = text[at]
    if escape in _CLASS_ESCAPES:
        ranges, negated = _CLASS_ESCAPES[escape]
        return _safe_class(ranges, negated=negated), at + 1
    if escape.isalnum() and escape not in _PLAIN_ESCAPES:
        raise Unsupported(f"the grammar cannot carry \\{escape}")
    return _char(_PLAIN_ESCAPES.get(escape, escape)), at + 1


def _char(char: str) -> Node:
    """``char`` as it is written inside a JSON string."""
    escaped = json.dumps(char)[1:-1]
    return lit(escaped)


def _class(text: str, at: int) -> tuple[Node, int]:
    negated = text.startswith("^", at)
    at += 1 if negated else 0
    ranges: list[tuple[str, str]] = []
    first = True
    while at < len(text) and (text[at] != "]" or first):
        first = False
        if text[at] == "\\" and at + 1 < len(text):
            escape = text[at + 1]
            if escape in _CLASS_ESCAPES:
                found, inverse = _CLASS_ESCAPES[escape]
                if inverse:
                    raise Unsupported(f"the grammar cannot carry \\{escape} inside a class")
                ranges += found
                at += 2
                continue
            start = _PLAIN_ESCAPES.get(escape, escape)
            at += 2
        else:
            start = text[at]
            at += 1
        if at + 1 < len(text) and text[at] == "-" and text[at + 1] != "]":
            end = text[at + 1]
            if end == "\\" and at + 2 < len(text):
                end = _PLAIN_ESCAPES.get(text[at + 2], text[at + 2])
                at += 1
            ranges.append((start, end))
            at += 2
        else:
            ranges.append((start, start))
    if at >= len(text):
        raise Unsupported("an unclosed character class")
    return _safe_class(tuple(ranges), negated=negated), at + 1


def _safe_class(ranges: tuple[tuple[str, str], ...], *, negated: bool) -> Node:
    """The class, without the characters a JSON string must escape (a narrower class is still valid)."""
    if negated:
        return cls(*ranges, *_UNSAFE, negated=True)
    kept: list[tuple[str, str]] = []
    for start, end in ranges:
        pieces = [(ord(start), ord(end))]
        for bad_start, bad_end in _UNSAFE:
            pieces = [
                piece
                for low, high in pieces
                for piece in ((low, min(high, ord(bad_start) - 1)), (max(low, ord(bad_end) + 1), high))
                if piece[0] <= piece[1]
            ]
        kept += [(chr(low), chr(high)) for low, high in pieces]
    if not kept:
        raise Unsupported("a character class of characters a JSON string must escape")
    return cls(*kept)


def _quantified(atom: Node, text: str, at: int) -> tuple[Node, int]:
    if at >= len(text):
        return atom, at
    char = text[at]
    if char == "*":
        node, at = rep(atom, 0, None), at + 1
    elif char == "+":
        node, at = rep(atom, 1, None), at + 1
    elif char == "?":
        node, at = rep(atom, 0, 1), at + 1
    elif char == "{":
        match = re.match(r"\{(\d+)(,(\d*))?\}", text[at:])
        if match is None:
            return atom, at
        low = int(match.group(1))
        high = low if match.group(2) is None else (int(match.group(3)) if match.group(3) else None)
        node, at = rep(atom, low, high), at + match.end()
    else:
        return atom, at
    if at < len(text) and text[at] in "?+":
        at += 1  # lazy or possessive: the same language
    return node, at


# -- rendering and drawing --------------------------------------------------------------------------

_ANY_VALUE = {
    "any-value": alt(
        Node("ref", text="any-object"),
        seq(lit("["), WS, _items(Node("ref", text="any-value"), 0, None), WS, lit("]")),
        seq(lit('"'), rep(STRING_CHAR, 0, None), lit('"')),
        seq(rep(lit("-"), 0, 1), int_range(0, None), rep(seq(lit("."), rep(DIGIT, 1, MAX_FRACTION)), 0, 1)),
        lit("true"),
        lit("false"),
        lit("null"),
    ),
    "any-object": seq(
        lit("{"),
        WS,
        _items(
            seq(lit('"'), rep(STRING_CHAR, 0, None), lit('"'), WS, lit(":"), WS, Node("ref", text="any-value")), 0, None
        ),
        WS,
        lit("}"),
    ),
}


def to_gbnf(root: Node, rules: dict[str, Node]) -> str:
    """The grammar as llama.cpp's GBNF text, its start rule ``root``."""
    every = {"root": root, **rules}
    if _mentions(every, "any-value"):
        every |= _ANY_VALUE
    return "".join(f"{name} ::= {_render(node)}\n" for name, node in every.items())


def _mentions(rules: dict[str, Node], name: str) -> bool:
    def walk(node: Node) -> bool:
        return (node.kind == "ref" and node.text == name) or any(walk(item) for item in node.items)

    return any(walk(node) for node in rules.values())


def _render(node: Node) -> str:
    if node.kind == "lit":
        return json.dumps(node.text, ensure_ascii=False) if node.text else '""'
    if node.kind == "cls":
        inside = "".join(_class_char(a) if a == b else f"{_class_char(a)}-{_class_char(b)}" for a, b in node.ranges)
        return f"[{'^' if node.negated else ''}{inside}]"
    if node.kind == "ref":
        return node.text
    if node.kind == "seq":
        return " ".join(_grouped(item) for item in node.items)
    if node.kind == "alt":
        return " | ".join(_render(item) for item in node.items)
    inner = _grouped(node.items[0], rep=True)
    if (node.low, node.high) == (0, None):
        return f"{inner}*"
    if (node.low, node.high) == (1, None):
        return f"{inner}+"
    if (node.low, node.high) == (0, 1):
        return f"{inner}?"
    high = "" if node.high is None else str(node.high)
    return f"{inner}{{{node.low}}}" if node.high == node.low else f"{inner}{{{node.low},{high}}}"


def _grouped(node: Node, *, rep: bool = False) -> str:
    text = _render(node)
    if node.kind == "alt" or (rep and node.kind in ("seq", "rep")):
        return f"({text})"
    return text


def _class_char(char: str) -> str:
    code = ord(char)
    if char in ']\\^-["' or code < 0x20 or code == 0x7F:  # GBNF escapes few characters: these by code
        return f"\\x{code:02X}"
    return char


def sample(root: Node, rules: dict[str, Node], rng: random.Random, *, depth: int = 0) -> str:
    """A sentence of the grammar, drawn at random (bounded: unbounded repeats stop early, recursion ends)."""
    every = {**_ANY_VALUE, **rules}
    return _draw(root, every, rng, depth)


def _draw(node: Node, rules: dict[str, Node], rng: random.Random, depth: int) -> str:
    if node.kind == "lit":
        return node.text
    if node.kind == "cls":
        return _draw_char(node, rng)
    if node.kind == "ref":
        return _draw(rules[node.text], rules, rng, depth + 1)
    if node.kind == "seq":
        return "".join(_draw(item, rules, rng, depth) for item in node.items)
    if node.kind == "alt":
        options = list(node.items)
        if depth > 6:  # deep in a recursion: prefer what ends it
            options.sort(key=_size)
            options = options[:1]
        return _draw(rng.choice(options), rules, rng, depth)
    high = node.low + (0 if depth > 6 else 3) if node.high is None else node.high
    count = rng.randint(node.low, max(node.low, min(high, node.low + 6)))
    return "".join(_draw(node.items[0], rules, rng, depth + (1 if node.high is None else 0)) for _ in range(count))


def _size(node: Node) -> int:
    if node.kind == "ref":
        return 1000
    return 1 + sum(_size(item) for item in node.items)


def _draw_char(node: Node, rng: random.Random) -> str:
    def inside(char: str) -> bool:
        return any(a <= char <= b for a, b in node.ranges)

    if node.negated:
        pool = [c for c in map(chr, range(0x20, 0x7F)) if not inside(c)] + ["é", "中"]
        pool = [c for c in pool if not inside(c)]
        return rng.choice(pool)
    start, end = rng.choice(node.ranges)
    return chr(rng.randint(ord(start), ord(end)))
