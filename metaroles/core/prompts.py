"""Prompt templates are package data files, rendered by a pure function with named variables."""

from __future__ import annotations

import string
from functools import cache
from importlib import resources

from metaroles.core.exceptions import InvalidValueError


@cache
def load_prompt(package: str, name: str) -> str:
    """Return the text of prompt file ``name`` shipped in ``package`` (e.g. ``"metaroles.actions.prompts"``)."""
    return resources.files(package).joinpath(name).read_text(encoding="utf-8")


def render_prompt(template: str, /, **variables: object) -> str:
    """Fill ``$name`` placeholders of ``template`` with ``variables``.

    Raises:
        InvalidValueError: If a placeholder has no value; the message names it.
    """
    try:
        return string.Template(template).substitute({k: str(v) for k, v in variables.items()})
    except KeyError as exc:
        given = ", ".join(sorted(variables)) or "none"
        raise InvalidValueError(
            f"prompt placeholder ${exc.args[0]} has no value (given: {given}); pass {exc.args[0]}=..."
        ) from None
