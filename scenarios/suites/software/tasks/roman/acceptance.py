"""Acceptance tests of the roman task (hidden from the company)."""

from solution import to_roman


def test_small():
    assert [to_roman(i) for i in (1, 4, 9, 14, 40)] == ["I", "IV", "IX", "XIV", "XL"]


def test_large():
    assert to_roman(1994) == "MCMXCIV"
    assert to_roman(3999) == "MMMCMXCIX"
