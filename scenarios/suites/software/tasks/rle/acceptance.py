"""Acceptance tests of the rle task (hidden from the company)."""

from solution import rle_decode, rle_encode


def test_encode():
    assert rle_encode("aaab") == "3a1b"
    assert rle_encode("") == ""


def test_round_trip():
    assert rle_decode(rle_encode("wwwwaaadexxxxxx")) == "wwwwaaadexxxxxx"
