"""A correct solution of the dedupe task (hidden from the company): the reference company answers with it."""


def dedupe(items):
    seen, out = set(), []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out
