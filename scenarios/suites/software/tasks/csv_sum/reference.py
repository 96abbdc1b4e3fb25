"""A correct solution of csv_sum, hidden from the company: the reference company's code."""

import csv
import io


def column_sums(csv_text):
    reader = csv.reader(io.StringIO(csv_text))
    header = next(reader)
    sums = {name: 0.0 for name in header}
    for row in reader:
        for name, cell in zip(header, row, strict=False):
            try:
                sums[name] += float(cell)
            except ValueError:
                pass
    return sums
