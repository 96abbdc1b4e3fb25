"""A correct solution of the primes task (hidden from the company): the reference company answers with it."""


def primes_up_to(n):
    return [k for k in range(2, n + 1) if all(k % d for d in range(2, int(k**0.5) + 1))]
