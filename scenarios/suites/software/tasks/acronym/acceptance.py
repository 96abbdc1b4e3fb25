"""Acceptance tests of the acronym task (hidden from the company)."""

from solution import acronym


def test_acronyms():
    assert acronym("Portable Network Graphics") == "PNG"
    assert acronym("complementary metal-oxide semiconductor") == "CMOS"
