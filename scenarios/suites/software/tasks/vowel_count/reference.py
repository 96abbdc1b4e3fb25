"""A correct solution of the vowel_count task (hidden from the company): the reference company answers with it."""


def count_vowels(text):
    return sum(1 for char in text.lower() if char in "aeiou")
