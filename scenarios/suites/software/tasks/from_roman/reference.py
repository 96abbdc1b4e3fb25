"""A correct solution of from_roman, hidden from the company: the reference company's code."""


def from_roman(numeral):
    values = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
    total = 0
    for i, char in enumerate(numeral):
        value = values[char]
        total += -value if i + 1 < len(numeral) and values[numeral[i + 1]] > value else value
    return total
