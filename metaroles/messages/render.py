"""Messages as people read them: a structured answer as a Markdown list of its fields, not one-line JSON.

Transcripts, ``metaroles show`` and the flow page all use :func:`readable`. Run ids (32 hex
digits) are for machines and are left out; so are empty fields.
"""

from __future__ import annotations

import re
from typing import Any

from metaroles.messages.message import Message

_RUN_ID = re.compile(r"^[0-9a-f]{32}$")


def readable(message: Message) -> str:
    """The message's text: its structured content as Markdown when the text is that content's JSON, else the text."""
    text = message.content or ""
    structured = message.instruct_content
    if structured is None or not text.lstrip().startswith("{"):
        return text
    return fields_markdown(structured.model_dump(mode="json")) or text


def fields_markdown(data: dict[str, Any], depth: int = 0) -> str:
    """``data`` as a Markdown list, ``- **field**: value``, nested objects and lists indented under their field."""
    pad = "  " * depth
    lines: list[str] = []
    for key, value in data.items():
        if _hidden(value):
            continue
        if isinstance(value, dict):
            inner = fields_markdown(value, depth + 1)
            lines.append(f"{pad}- **{key}**:" + (f"\n{inner}" if inner else " (empty)"))
        elif isinstance(value, list):
            lines.append(f"{pad}- **{key}**:" + ("" if value else " (none)"))
            lines.extend(_item(item, depth + 1) for item in value)
        else:
            lines.append(f"{pad}- **{key}**: {_scalar(value, pad)}")
    return "\n".join(lines)


def _item(item: Any, depth: int) -> str:
    pad = "  " * depth
    if isinstance(item, dict):
        inner = fields_markdown(item, depth + 1)
        return f"{pad}-\n{inner}" if inner else f"{pad}- (empty)"
    if isinstance(item, list):
        return f"{pad}- " + ", ".join(_scalar(v, pad) for v in item)
    return f"{pad}- {_scalar(item, pad)}"


def _scalar(value: Any, pad: str) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value).replace("\n", f"\n{pad}  ")


def _hidden(value: Any) -> bool:
    return value is None or value == "" or (isinstance(value, str) and _RUN_ID.match(value) is not None)
