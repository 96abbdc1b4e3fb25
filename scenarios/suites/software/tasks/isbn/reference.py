"""A correct solution of isbn, hidden from the company: the reference company's code."""


def valid_isbn10(code):
    chars = code.replace("-", "")
    if len(chars) != 10:
        return False
    total = 0
    for i, char in enumerate(chars):
        if char == "X" and i == 9:
            value = 10
        elif char.isdigit():
            value = int(char)
        else:
            return False
        total += value * (10 - i)
    return total % 11 == 0
