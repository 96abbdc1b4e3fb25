"""A correct solution of the chunk task (hidden from the company): the reference company answers with it."""


def chunk(items, size):
    return [items[i : i + size] for i in range(0, len(items), size)]
