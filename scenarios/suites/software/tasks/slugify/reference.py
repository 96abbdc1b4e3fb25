"""A correct solution of slugify, hidden from the company: the reference company's code."""

import re


def slugify(title):
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
