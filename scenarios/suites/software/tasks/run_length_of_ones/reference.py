"""A correct solution of the run_length_of_ones task (hidden from the company): the reference company answers with it."""


def longest_run(bits):
    return max((len(run) for run in bits.split("0")), default=0)
