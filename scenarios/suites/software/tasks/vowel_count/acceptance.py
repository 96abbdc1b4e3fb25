"""Acceptance tests of the vowel_count task (hidden from the company)."""

from solution import count_vowels


def test_vowels():
    assert count_vowels("Hello World") == 3
    assert count_vowels("AEIOU xyz") == 5
    assert count_vowels("") == 0
