"""A correct solution of the matrix_transpose task (hidden from the company): the reference company answers with it."""


def transpose(matrix):
    return [list(row) for row in zip(*matrix)]
