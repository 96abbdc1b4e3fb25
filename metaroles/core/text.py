"""Text that leaves the program: URLs without their credentials, model output without terminal control."""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

REDACTED = "***"

_CONTROL = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, screen clears
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: window titles, hyperlinks, clipboard writes
    r"|\x1b[P^_][^\x1b]*(?:\x1b\\)?"  # DCS, PM, APC strings
    r"|\x1b[@-Z\\-_]?"  # other escapes (and a lone ESC)
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # C0 but tab and newline, DEL, C1
    r"|[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"  # bidi marks and overrides: text shown reordered
)


def redacted(url: str | None) -> str | None:
    """``url`` with any user name and password replaced by ``***`` (``http://***@host/v1``)."""
    if not url or "@" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{REDACTED}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


_URL_CREDENTIALS = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]+@")


def scrubbed(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` (a server's output, an error) with URL credentials and each of ``secrets`` replaced by ``***``.

    ``secrets`` are values a process was given (its environment): any of four characters or more is
    taken out wherever it appears.
    """
    text = _URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    for secret in sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def printable(text: str) -> str:
    """``text`` without escape sequences, control characters and bidi overrides (tabs, newlines stay): for a tty."""
    return _CONTROL.sub("", text)


def jsonl_lines(text: str) -> list[str]:
    """The lines of JSON-lines text, split at newlines only.

    JSON written as it is (``ensure_ascii=False``, pydantic's ``model_dump_json``) may hold U+2028,
    U+2029 or U+0085 inside a string: ``str.splitlines`` would cut a record there.
    """
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines
