"""A correct solution of dedupe, hidden from the company: the reference company's code."""


def dedupe(items):
    seen, out = set(), []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out
