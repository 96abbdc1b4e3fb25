"""Acceptance tests of the temperature task (hidden from the company)."""

from solution import c_to_f, f_to_c


def test_points():
    assert c_to_f(100) == 212
    assert c_to_f(-40) == -40
    assert f_to_c(32) == 0


def test_round_trip():
    assert abs(f_to_c(c_to_f(37.5)) - 37.5) < 1e-9
