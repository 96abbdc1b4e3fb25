"""An ensemble's, a sweep's or an evaluation's report as a page (``metaroles watch FOLDER``).

The folder's reports as they were written — ``ensemble.md``, an evaluation's ``report.md`` and
``table.md`` — shown as text, with their pictures (``ensemble.svg``; ``rounds.svg``, the settings side
by side over the rounds; the evaluation's ``plots/``).
Only those files are served, each by its name; nothing in the folder runs, and its text is put into
the page escaped.
"""

from __future__ import annotations

import html
import threading
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from metaroles.core.exceptions import ConfigError

TEXTS = ("ensemble.md", "report.md", "table.md")
"""The reports a folder may hold, in the order the page shows them."""
_KINDS = {".svg": "image/svg+xml", ".png": "image/png"}
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


def has_reports(folder: Path) -> bool:
    """Whether ``folder`` holds a report this page shows (and is no run directory)."""
    return not (folder / "manifest.json").is_file() and any((folder / name).is_file() for name in TEXTS)


def report_app(folder: Path) -> Starlette:
    """The page of ``folder``'s reports.

    Raises:
        ConfigError: If the folder holds none (naming the files looked for).
    """
    if not has_reports(folder):
        raise ConfigError(f"{str(folder)!r} holds no report ({', '.join(TEXTS)}); run metaroles branch, sweep or eval")
    pictures = sorted(
        str(p.relative_to(folder))
        for p in [folder / "ensemble.svg", folder / "rounds.svg", *sorted((folder / "plots").glob("*.png"))]
        if p.is_file()
    )  # fmt: skip

    async def page(request: Request) -> Response:
        parts = [f"<!doctype html><meta charset='utf-8'><title>{html.escape(folder.name)}</title>"]
        parts.append(f"<h1>{html.escape(folder.name)}</h1>")
        for name in pictures:
            parts.append(f"<figure><img src='/file/{html.escape(name)}' alt='{html.escape(name)}'></figure>")
        for name in TEXTS:
            if (folder / name).is_file():
                text = (folder / name).read_text(encoding="utf-8", errors="replace")
                parts.append(f"<h2>{name}</h2><pre id='{name.replace('.', '-')}'>{html.escape(text)}</pre>")
        return Response("\n".join(parts), media_type="text/html", headers=_HEADERS)

    async def file(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in pictures:
            return Response(f"no picture {name!r} in the report", status_code=404, headers=_HEADERS)
        return Response((folder / name).read_bytes(), media_type=_KINDS[Path(name).suffix], headers=_HEADERS)

    app = Starlette(routes=[Route("/", page), Route("/file/{name:path}", file)])
    app.state.closing = threading.Event()  # what a WatchServer sets as it stops (no stream here to end)
    return app
