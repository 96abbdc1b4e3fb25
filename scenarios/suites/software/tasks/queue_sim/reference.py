"""A correct solution of the queue_sim task (hidden from the company): the reference company answers with it."""


def checkout_times(arrivals, service):
    leaving, free = [], 0
    for arrival in arrivals:
        free = max(free, arrival) + service
        leaving.append(free)
    return leaving
