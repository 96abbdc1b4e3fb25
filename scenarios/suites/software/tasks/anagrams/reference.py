"""A correct solution of the anagrams task (hidden from the company): the reference company answers with it."""


def group_anagrams(words):
    groups = {}
    for word in words:
        groups.setdefault("".join(sorted(word)), []).append(word)
    return sorted(sorted(group) for group in groups.values())
