"""A correct solution of the palindrome task (hidden from the company): the reference company answers with it."""


def is_palindrome(text):
    kept = [char.lower() for char in text if char.isalnum()]
    return kept == kept[::-1]
