"""A correct solution of rock_paper_scissors, hidden from the company: the reference company's code."""


def rps(a, b):
    beats = {"rock": "scissors", "paper": "rock", "scissors": "paper"}
    return 0 if a == b else 1 if beats[a] == b else -1
