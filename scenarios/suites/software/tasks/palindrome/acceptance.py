"""Acceptance tests of the palindrome task (hidden from the company)."""

from solution import is_palindrome


def test_yes():
    assert is_palindrome("A man, a plan, a canal: Panama")
    assert is_palindrome("")


def test_no():
    assert not is_palindrome("hello")
