"""``metaroles population``: personas drawn from a census table, its marginals kept to the person."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Annotated

import typer

from metaroles.cli.common import app, reported
from metaroles.core.exceptions import ConfigError
from metaroles.core.files import write_atomic

FORMATS = (".jsonl", ".csv", ".parquet")


@app.command()
def population(
    census: Annotated[
        Path, typer.Argument(help="a CSV of marginal counts (attribute,category,count) or of joint counts (… ,count)")
    ],
    n: Annotated[int, typer.Option("--n", help="personas to draw")] = 1000,
    sample: Annotated[
        Path | None,
        typer.Option(
            help="joint counts of a sample (a column per attribute, count): the fit starts from its associations"
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="seed of the personas' order")] = 0,
    out: Annotated[Path, typer.Option(help="where to write them: .jsonl, .csv or .parquet")] = Path("personas.jsonl"),
) -> None:
    """Draw N personas whose attributes have the census's marginal shares (raking), each with a bio line."""
    from metaroles.project.population import bio, diversity, rake, read_census

    with reported():
        if out.suffix not in FORMATS:
            raise ConfigError(f"--out {str(out)!r}: write .jsonl, .csv or .parquet")
        table = read_census(census, sample=sample)
        people = [{**person, "bio": bio(person)} for person in rake(table, n, seed=seed)]
        _write(out, people, [*table.attributes, "bio"])
    spread = diversity(people, table.attributes)
    typer.echo(
        f"{len(people)} personas in {out}: every category's share is the census's to the person; coverage "
        f"{spread['coverage']:.3g} of the attributes' combinations, entropy {spread['entropy']:.3g}"
    )


def _write(out: Path, people: list[dict[str, str]], columns: list[str]) -> None:
    """The personas as JSON lines, CSV or Parquet, written whole or not at all."""
    if out.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        temporary = out.with_name(out.name + ".tmp")
        pq.write_table(pa.table({c: [p[c] for p in people] for c in columns}), temporary)
        temporary.replace(out)
        return
    if out.suffix == ".csv":
        text = io.StringIO()
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([p[c] for c in columns] for p in people)
        write_atomic(out, text.getvalue())
        return
    write_atomic(out, "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in people))
