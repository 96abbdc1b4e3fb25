"""A correct solution of caesar, hidden from the company: the reference company's code."""


def caesar(text, shift):
    out = []
    for char in text:
        if char.isascii() and char.isalpha():
            base = ord("a") if char.islower() else ord("A")
            out.append(chr(base + (ord(char) - base + shift) % 26))
        else:
            out.append(char)
    return "".join(out)
