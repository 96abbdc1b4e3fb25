"""Acceptance tests of the anagrams task (hidden from the company)."""

from solution import group_anagrams


def test_groups():
    assert group_anagrams(["eat", "tea", "tan", "ate", "nat", "bat"]) == [
        ["ate", "eat", "tea"],
        ["bat"],
        ["nat", "tan"],
    ]


def test_empty():
    assert group_anagrams([]) == []
