"""A correct solution of the rock_paper_scissors task (hidden from the company): the reference company answers with it."""


def rps(a, b):
    beats = {"rock": "scissors", "paper": "rock", "scissors": "paper"}
    return 0 if a == b else 1 if beats[a] == b else -1
