"""A correct solution of vowel_count, hidden from the company: the reference company's code."""


def count_vowels(text):
    return sum(1 for char in text.lower() if char in "aeiou")
