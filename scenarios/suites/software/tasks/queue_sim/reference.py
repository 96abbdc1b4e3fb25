"""A correct solution of queue_sim, hidden from the company: the reference company's code."""


def checkout_times(arrivals, service):
    leaving, free = [], 0
    for arrival in arrivals:
        free = max(free, arrival) + service
        leaving.append(free)
    return leaving
