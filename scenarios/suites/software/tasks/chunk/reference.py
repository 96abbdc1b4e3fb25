"""A correct solution of chunk, hidden from the company: the reference company's code."""


def chunk(items, size):
    return [items[i : i + size] for i in range(0, len(items), size)]
