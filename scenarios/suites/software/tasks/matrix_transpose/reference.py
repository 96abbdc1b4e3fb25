"""A correct solution of matrix_transpose, hidden from the company: the reference company's code."""


def transpose(matrix):
    return [list(row) for row in zip(*matrix, strict=True)]
