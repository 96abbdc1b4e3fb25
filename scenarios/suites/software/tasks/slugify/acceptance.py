"""Acceptance tests of the slugify task (hidden from the company)."""

from solution import slugify


def test_slug():
    assert slugify("Hello, World!") == "hello-world"
    assert slugify("  Python 3.12 -- Released  ") == "python-3-12-released"


def test_empty():
    assert slugify("!!!") == ""
