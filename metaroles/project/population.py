"""Populations from a census: personas whose attributes have the census's marginals.

A census table is a CSV of marginal counts (``attribute,category,count``: age 18-29 → 2,110, …) or
of joint counts (a column per attribute and ``count``: a microdata sample or a published cross-
table). :func:`rake` fits a joint distribution to the marginals by iterative proportional fitting
(the ``ipfn`` library), starting from a sample's joint counts when one is given (so the
associations between attributes are the sample's) or from independence, and turns it into
``n`` whole people: each cell's count by the largest remainder, then people moved between cells that
differ in one attribute only (which changes no other marginal) until every category has its share
of ``n`` to the person. :func:`diversity` says how much of the attribute space a population covers.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metaroles.core.exceptions import ConfigError

TOTALS_AGREE = 0.01
"""How far apart the attributes' totals of a marginals table may be (a share of the largest): one population."""


@dataclass(frozen=True)
class Census:
    """Attributes, each with its categories in order, their marginal counts, and a joint seed if given."""

    attributes: dict[str, list[str]]
    marginals: dict[str, list[float]]
    joint: Any = None
    """Joint counts (a numpy array, an axis per attribute) to start the fit from; ``None``: independence."""


def read_census(path: Path, *, sample: Path | None = None) -> Census:
    """A census table's marginals (or a joint table's), and a sample's joint counts as the fit's seed.

    Raises:
        ConfigError: For an unreadable file, a count that is not a non-negative number, no rows, or
            attributes whose totals disagree (they would describe different populations).
    """
    header, rows = _rows(path)
    if header[:3] == ["attribute", "category", "count"]:
        census = _from_marginals(path, rows)
    else:
        joint = _joint(path, header, rows)
        census = Census(joint.attributes, joint.marginals, joint.joint)
    if sample is not None:
        census = Census(census.attributes, census.marginals, _seed(census, read_census(sample)))
    return census


def _rows(path: Path) -> tuple[list[str], list[list[str]]]:
    try:
        with path.open(encoding="utf-8-sig", newline="") as file:
            table = list(csv.reader(file))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"census table {str(path)!r} cannot be read ({exc}); give a CSV file in UTF-8") from None
    if len(table) < 2:
        raise ConfigError(f"census table {str(path)!r} has no rows; give attribute,category,count rows or joint counts")
    return [h.strip() for h in table[0]], [row for row in table[1:] if any(cell.strip() for cell in row)]


def _count(path: Path, line: int, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{path}:{line}: count {text!r} is not a number >= 0; give each row's count")
    return value


def _from_marginals(path: Path, rows: list[list[str]]) -> Census:
    counts: dict[str, dict[str, float]] = {}
    for line, row in enumerate(rows, 2):
        if len(row) < 3:
            raise ConfigError(f"{path}:{line}: {row!r} is not attribute,category,count; give three cells")
        attribute, category = row[0].strip(), row[1].strip()
        counts.setdefault(attribute, {})
        counts[attribute][category] = counts[attribute].get(category, 0.0) + _count(path, line, row[2])
    totals = {attribute: sum(by.values()) for attribute, by in counts.items()}
    largest = max(totals.values())
    if largest <= 0 or max(totals.values()) - min(totals.values()) > TOTALS_AGREE * largest:
        said = ", ".join(f"{a} sums to {t:g}" for a, t in totals.items())
        raise ConfigError(
            f"census table {str(path)!r}: the attributes' marginals disagree ({said}); each attribute must count the "
            f"same people (within {TOTALS_AGREE:.0%})"
        )
    return Census({a: list(by) for a, by in counts.items()}, {a: list(by.values()) for a, by in counts.items()})


def _joint(path: Path, header: list[str], rows: list[list[str]]) -> Census:
    import numpy as np

    if "count" not in header or len(header) < 2:
        raise ConfigError(
            f"census table {str(path)!r}: header {header!r} is neither attribute,category,count nor attribute "
            "columns and a count column"
        )
    where = header.index("count")
    names = [h for i, h in enumerate(header) if i != where]
    cells = [
        ([row[i].strip() for i in range(len(header)) if i != where], _count(path, n, row[where]))
        for n, row in enumerate(rows, 2)
    ]
    attributes = {name: sorted({cell[k] for cell, _ in cells}) for k, name in enumerate(names)}
    joint = np.zeros([len(c) for c in attributes.values()])
    for cell, count in cells:
        joint[tuple(attributes[name].index(cell[k]) for k, name in enumerate(names))] += count
    marginals = {
        name: list(joint.sum(axis=tuple(j for j in range(len(names)) if j != k))) for k, name in enumerate(names)
    }
    return Census(attributes, marginals, joint)


def _seed(census: Census, sample: Census) -> Any:
    """The sample's joint counts laid out on the census's attributes and categories (a category it lacks: a little)."""
    import numpy as np

    missing = set(census.attributes) - set(sample.attributes)
    if missing or sample.joint is None:
        raise ConfigError(
            f"the sample gives no joint counts of {sorted(missing) or sorted(census.attributes)}; give a CSV with a "
            "column per census attribute and a count column"
        )
    names = list(sample.attributes)
    seed = np.full([len(c) for c in census.attributes.values()], 0.5)  # a cell the sample never saw stays possible
    for index in np.ndindex(*sample.joint.shape):
        found = {names[k]: sample.attributes[names[k]][i] for k, i in enumerate(index)}
        try:
            at = tuple(census.attributes[a].index(found[a]) for a in census.attributes)
        except ValueError:
            continue
        seed[at] += sample.joint[index]
    return seed


def rake(census: Census, n: int, *, seed: int = 0) -> list[dict[str, str]]:
    """``n`` personas whose attributes have the census's marginal shares (each category to the person).

    Raises:
        ConfigError: If ``n`` is not positive.
    """
    if n < 1:
        raise ConfigError(f"n={n} personas; give at least 1")
    counts = whole_people(fitted(census), _targets(census, n))
    names = list(census.attributes)
    import numpy as np

    people = [
        dict(zip(names, (census.attributes[a][i] for a, i in zip(names, index, strict=True)), strict=True))
        for index in np.argwhere(counts > 0)
        for _ in range(int(counts[tuple(index)]))
    ]
    random.Random(seed).shuffle(people)
    return people


def fitted(census: Census) -> Any:
    """The joint distribution (shares summing to 1) fitted to the census's marginals by IPF."""
    import numpy as np
    from ipfn import ipfn

    start = census.joint if census.joint is not None else np.ones([len(c) for c in census.attributes.values()])
    total = sum(next(iter(census.marginals.values())))
    aggregates = [np.array(census.marginals[a], dtype=float) / total for a in census.attributes]
    fit = ipfn.ipfn(
        np.array(start, dtype=float) / float(np.sum(start)),
        aggregates,
        [[k] for k in range(len(aggregates))],
        convergence_rate=1e-10,
        max_iteration=1000,
    ).iteration()
    return fit / fit.sum()


def _targets(census: Census, n: int) -> list[list[int]]:
    """Each attribute's categories as whole people summing to ``n`` (largest remainder)."""
    return [largest_remainder([c / sum(counts) * n for c in counts]) for counts in census.marginals.values()]


def largest_remainder(shares: Sequence[float]) -> list[int]:
    """Whole numbers near ``shares`` with their (rounded) sum: the largest fractions rounded up."""
    floors = [math.floor(s) for s in shares]
    left = round(sum(shares)) - sum(floors)
    order = sorted(range(len(shares)), key=lambda i: (floors[i] - shares[i], i))
    for i in order[:left]:
        floors[i] += 1
    return floors


def whole_people(joint: Any, targets: list[list[int]]) -> Any:
    """Cell counts near ``joint`` × n whose marginals are ``targets`` exactly.

    Cells by the largest remainder, then, attribute by attribute, people moved from a category over
    its target to one under it within the same cell of the other attributes (so no other marginal
    changes), from the fullest cells first.
    """
    import numpy as np

    n = sum(targets[0])
    counts = np.array(largest_remainder(list((joint * n).ravel())), dtype=np.int64).reshape(joint.shape)
    for axis, target in enumerate(targets):
        moved = np.moveaxis(counts, axis, 0)
        rows = moved.reshape(len(target), -1).copy()  # a row per category of this attribute, a column per rest
        _balance(rows, target)
        counts = np.moveaxis(rows.reshape(moved.shape), 0, axis)
    return np.ascontiguousarray(counts)


def _balance(rows: Any, target: Sequence[int]) -> None:
    """Move people between rows (categories), column by column, until each row sums to its target."""
    import numpy as np

    have = rows.sum(axis=1)
    while (over := next((i for i in range(len(target)) if have[i] > target[i]), None)) is not None:
        under = next(i for i in range(len(target)) if have[i] < target[i])
        need = int(min(have[over] - target[over], target[under] - have[under]))
        for cell in np.argsort(-rows[over], kind="stable"):
            take = int(min(need, rows[over, cell]))
            rows[over, cell] -= take
            rows[under, cell] += take
            need -= take
            if need == 0:
                break
        have = rows.sum(axis=1)


def diversity(people: Sequence[Mapping[str, str]], attributes: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """How much of the attribute space a population covers, and how evenly.

    ``coverage``: the share of the combinations of categories someone has; ``entropy``: the joint
    Shannon entropy over its maximum (1: every combination equally often); ``entropy.ATTR``: each
    attribute's own, over its maximum.
    """
    if not people:
        return {"coverage": 0.0, "entropy": 0.0}
    names = list(attributes)
    combos: dict[tuple[str, ...], int] = {}
    for person in people:
        key = tuple(person[a] for a in names)
        combos[key] = combos.get(key, 0) + 1
    space = math.prod(len(c) for c in attributes.values())
    found = {"coverage": round(len(combos) / space, 6), "entropy": round(_entropy(combos.values(), space), 6)}
    for name in names:
        by: dict[str, int] = {}
        for person in people:
            by[person[name]] = by.get(person[name], 0) + 1
        found[f"entropy.{name}"] = round(_entropy(by.values(), len(attributes[name])), 6)
    return found


def _entropy(counts: Iterator[int] | Any, space: int) -> float:
    values = list(counts)
    total = sum(values)
    h = -sum(c / total * math.log(c / total) for c in values if c)
    return h / math.log(space) if space > 1 else 1.0


def bio(person: Mapping[str, str]) -> str:
    """A persona's line for a model: "age 30-44, gender female, region North"."""
    return ", ".join(f"{name} {value}" for name, value in person.items())
