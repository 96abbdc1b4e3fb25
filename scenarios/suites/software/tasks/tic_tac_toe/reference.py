"""A correct solution of tic_tac_toe, hidden from the company: the reference company's code."""


def winner(board):
    lines = list(board) + ["".join(row[i] for row in board) for i in range(3)]
    lines += ["".join(board[i][i] for i in range(3)), "".join(board[i][2 - i] for i in range(3))]
    for line in lines:
        if line in ("XXX", "OOO"):
            return line[0]
    return None
