"""A correct solution of word_count, hidden from the company: the reference company's code."""


def count_words(text):
    return len(text.split())
