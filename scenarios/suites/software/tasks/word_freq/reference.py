"""A correct solution of the word_freq task (hidden from the company): the reference company answers with it."""

from collections import Counter


def top_words(text, k):
    counts = Counter(text.lower().split())
    return sorted(counts.items(), key=lambda pair: (-pair[1], pair[0]))[:k]
