"""A correct solution of the slugify task (hidden from the company): the reference company answers with it."""

import re


def slugify(title):
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
