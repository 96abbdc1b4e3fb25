"""A correct solution of the leap_year task (hidden from the company): the reference company answers with it."""


def is_leap(year):
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
