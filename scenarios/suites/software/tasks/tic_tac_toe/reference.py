"""A correct solution of the tic_tac_toe task (hidden from the company): the reference company answers with it."""


def winner(board):
    lines = list(board) + ["".join(row[i] for row in board) for i in range(3)]
    lines += ["".join(board[i][i] for i in range(3)), "".join(board[i][2 - i] for i in range(3))]
    for line in lines:
        if line in ("XXX", "OOO"):
            return line[0]
    return None
