"""A correct solution of grade_book, hidden from the company: the reference company's code."""


def letter_grade(score):
    for bound, grade in ((90, "A"), (80, "B"), (70, "C"), (60, "D")):
        if score >= bound:
            return grade
    return "F"
