"""A correct solution of primes, hidden from the company: the reference company's code."""


def primes_up_to(n):
    return [k for k in range(2, n + 1) if all(k % d for d in range(2, int(k**0.5) + 1))]
