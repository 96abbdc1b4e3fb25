"""Acceptance tests of the grade_book task (hidden from the company)."""

from solution import letter_grade


def test_grades():
    assert [letter_grade(s) for s in (95, 90, 85, 72, 60, 59, 0)] == ["A", "A", "B", "C", "D", "F", "F"]
