"""A correct solution of bowling, hidden from the company: the reference company's code."""


def bowling_score(rolls):
    score, index = 0, 0
    for _ in range(10):
        if rolls[index] == 10:
            score += 10 + rolls[index + 1] + rolls[index + 2]
            index += 1
        elif rolls[index] + rolls[index + 1] == 10:
            score += 10 + rolls[index + 2]
            index += 2
        else:
            score += rolls[index] + rolls[index + 1]
            index += 2
    return score
