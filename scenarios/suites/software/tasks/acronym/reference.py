"""A correct solution of the acronym task (hidden from the company): the reference company answers with it."""


def acronym(phrase):
    return "".join(word[0].upper() for word in phrase.replace("-", " ").split())
