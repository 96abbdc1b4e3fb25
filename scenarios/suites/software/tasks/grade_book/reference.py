"""A correct solution of the grade_book task (hidden from the company): the reference company answers with it."""


def letter_grade(score):
    for bound, grade in ((90, "A"), (80, "B"), (70, "C"), (60, "D")):
        if score >= bound:
            return grade
    return "F"
