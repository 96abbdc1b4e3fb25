"""A correct solution of palindrome, hidden from the company: the reference company's code."""


def is_palindrome(text):
    kept = [char.lower() for char in text if char.isalnum()]
    return kept == kept[::-1]
