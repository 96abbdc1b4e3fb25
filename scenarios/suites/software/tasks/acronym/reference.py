"""A correct solution of acronym, hidden from the company: the reference company's code."""


def acronym(phrase):
    return "".join(word[0].upper() for word in phrase.replace("-", " ").split())
