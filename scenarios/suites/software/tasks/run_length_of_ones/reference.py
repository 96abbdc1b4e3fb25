"""A correct solution of run_length_of_ones, hidden from the company: the reference company's code."""


def longest_run(bits):
    return max((len(run) for run in bits.split("0")), default=0)
