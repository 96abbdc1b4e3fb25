"""A correct solution of anagrams, hidden from the company: the reference company's code."""


def group_anagrams(words):
    groups = {}
    for word in words:
        groups.setdefault("".join(sorted(word)), []).append(word)
    return sorted(sorted(group) for group in groups.values())
