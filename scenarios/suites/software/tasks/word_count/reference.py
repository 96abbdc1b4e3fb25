"""A correct solution of the word_count task (hidden from the company): the reference company answers with it."""


def count_words(text):
    return len(text.split())
