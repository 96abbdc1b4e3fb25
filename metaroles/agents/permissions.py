"""Who may call which tool: ``allow``, ``ask`` or ``deny``, per role and per tool.

:class:`Permissions` holds the rules: for each role (or ``"*"``, every role) the tools (a name,
or a pattern such as ``fs__write_*``) and what a call to them gets. A role's own rules come
before everyone's; within them a tool's own name before a pattern, patterns in the order given;
nothing that matches: ``default``. A denied call is an observation the agent reads (a
:class:`~metaroles.agents.tool.ToolFailure`), never an error.

``ask`` puts the call to someone: a policy function (``(role, tool, arguments) -> bool``, plain
or async) or a person at a :class:`~metaroles.llm.human.Desk` (:func:`desk_asker`: the terminal,
or the watch page). A person who does not answer in time has said no. What was decided is the
call's result, recorded with it (:class:`~metaroles.agents.mcp.ToolCassette`): a replay asks nobody.
"""

from __future__ import annotations

import inspect
import itertools
import json
from collections.abc import Awaitable, Callable
from fnmatch import fnmatchcase
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from metaroles.core.exceptions import InvalidValueError
from metaroles.llm.human import Desk, HumanQuestion, parse_answer

__all__ = ["ASK_SECONDS", "Asker", "Decision", "Permissions", "desk_asker", "permit_rule"]

Decision = Literal["allow", "ask", "deny"]
DECISIONS = ("allow", "ask", "deny")

Asker = Callable[[str, str, dict[str, Any]], "bool | Awaitable[bool]"]
"""Decides an ``ask``: ``(role, tool, arguments)`` → whether the call may go ahead."""

ASK_SECONDS = 120.0
"""How long a person has to allow a call before it is denied."""

FIRST_QUESTION = 1_000_001
"""Permission questions are numbered from here, apart from a person's turns for a role (numbered from 1)."""


class Permissions(BaseModel):
    """Rules: role (or ``"*"``) → tool name or pattern (or ``"*"``) → ``allow`` / ``ask`` / ``deny``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rules: dict[str, dict[str, Decision]] = {}
    default: Decision = "allow"

    def decision(self, role: str, tool: str) -> Decision:
        """What a call of ``tool`` by ``role`` gets."""
        for who in (role, "*"):
            patterns = self.rules.get(who, {})
            if tool in patterns:
                return patterns[tool]
            for pattern, decision in patterns.items():
                if fnmatchcase(tool, pattern):
                    return decision
        return self.default

    @property
    def asks(self) -> bool:
        """Whether some call may have to be asked about."""
        return self.default == "ask" or any("ask" in tools.values() for tools in self.rules.values())

    def with_rule(self, role: str, tool: str, decision: Decision) -> Permissions:
        """These rules and one more (it comes after the role's other rules)."""
        rules = {who: dict(tools) for who, tools in self.rules.items()}
        rules.setdefault(role, {})[tool] = decision
        return Permissions(rules=rules, default=self.default)


def permit_rule(text: str) -> tuple[str, str, Decision]:
    """``ROLE:TOOL=DECISION`` (``--permit``) as its three parts; ``*`` for every role or tool.

    Raises:
        InvalidValueError: Naming the text and the form it takes.
    """
    who, _, rest = text.partition(":")
    tool, _, decision = rest.partition("=")
    if not (who and tool and decision in DECISIONS):
        raise InvalidValueError(
            f"--permit {text!r} is not ROLE:TOOL=DECISION with DECISION allow, ask or deny; "
            "e.g. --permit 'Assistant:files__write_file=ask' or --permit '*:*=deny'"
        )
    return who, tool, decision  # type: ignore[return-value]  # checked against DECISIONS above


async def decided(asker: Asker, role: str, tool: str, arguments: dict[str, Any]) -> bool:
    """What ``asker`` says of this call (a policy function may be plain or async)."""
    answer = asker(role, tool, arguments)
    if inspect.isawaitable(answer):
        answer = await answer
    return answer is True


def desk_asker(desk: Desk, seconds: float = ASK_SECONDS) -> Asker:
    """Ask a person at ``desk`` (yes or no) whether a role may make a call; no answer in time is no."""
    numbers = itertools.count(FIRST_QUESTION)
    fields = {"allow": ["yes", "no"]}
    schema = {"type": "object", "properties": {"allow": {"type": "boolean"}}, "required": ["allow"]}

    async def ask(role: str, tool: str, arguments: dict[str, Any]) -> bool:
        given = json.dumps(arguments, ensure_ascii=False, sort_keys=True)
        prompt = f"{role} asks to call the tool {tool} with {given[:2000]}. Allow it? (yes or no)"
        text = await desk.ask(HumanQuestion(next(numbers), role, "permission", prompt, fields), seconds)
        answer = None if text is None else parse_answer(text, schema)
        return answer is not None and json.loads(answer)["allow"] is True

    return ask
