"""A correct solution of word_freq, hidden from the company: the reference company's code."""

from collections import Counter


def top_words(text, k):
    counts = Counter(text.lower().split())
    return sorted(counts.items(), key=lambda pair: (-pair[1], pair[0]))[:k]
