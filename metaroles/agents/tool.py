"""Tools an agent can call (the OpenManus tool layer): BaseTool, ToolResult, ToolCollection, Terminate.

A tool has a ``name``, a ``description`` and ``parameters`` (a JSON schema); ``to_param()`` gives
the OpenAI function format. Calling a tool validates the arguments against its schema first (a
clear :class:`ToolArgumentsInvalid` naming the argument), then awaits ``execute``. A
:class:`ToolCollection` refuses two tools with one name and turns unknown tools, invalid arguments
and :class:`ToolError` into :class:`ToolFailure` results, so an agent observes them and goes on.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator
from functools import lru_cache
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from metaroles.core.exceptions import DuplicateToolError, ToolArgumentsInvalid, ToolError


class ToolResult(BaseModel):
    """What a tool returns: output, error, an image, or a system note."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    output: Any = None
    error: str | None = None
    base64_image: str | None = None
    system: str | None = None

    def __bool__(self) -> bool:
        """True when any field is set."""
        return any(getattr(self, field) for field in type(self).model_fields)

    def __str__(self) -> str:
        """The error (prefixed) if any, else the output."""
        if self.error:
            return f"Error: {self.error}"
        return "" if self.output is None else str(self.output)

    def __add__(self, other: ToolResult) -> ToolResult:
        """Combine two results: texts concatenate; two images cannot be combined.

        Raises:
            ValueError: If both results carry an image, or non-text values in the same field.
        """
        return ToolResult(
            output=_combine(self.output, other.output, "output"),
            error=_combine(self.error, other.error, "error"),
            base64_image=_combine(self.base64_image, other.base64_image, "base64_image", concatenate=False),
            system=_combine(self.system, other.system, "system"),
        )

    def replace(self, **changes: Any) -> ToolResult:
        """A copy with ``changes`` applied (same class)."""
        return type(self)(**{**self.model_dump(), **changes})


class ToolFailure(ToolResult):
    """A ToolResult that reports a failure."""


class CLIResult(ToolResult):
    """A ToolResult shown as a command's output (OpenManus' ``CLIResult``)."""


def _combine(first: Any, second: Any, field: str, *, concatenate: bool = True) -> Any:
    if first and second:
        if concatenate and isinstance(first, str) and isinstance(second, str):
            return first + second
        raise ValueError(f"cannot combine two tool results that both set {field!r}")
    return first or second


class BaseTool(BaseModel, ABC):
    """A tool: name, description, JSON-schema parameters and an async ``execute``.

    Subclasses set the three fields as defaults and implement ``execute(**arguments)``.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str
    description: str
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    async def __call__(self, **arguments: Any) -> Any:
        """Validate ``arguments`` against :attr:`parameters`, then execute.

        Raises:
            ToolArgumentsInvalid: If the arguments do not match the schema (names the argument).
        """
        return await self.execute(**self.validate_arguments(arguments))

    @abstractmethod
    async def execute(self, **arguments: Any) -> Any:
        """Do the tool's work."""

    def to_param(self) -> dict[str, Any]:
        """The tool in the OpenAI function-calling format."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def validate_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """``arguments`` checked against the schema, with defaults filled in.

        The whole JSON schema applies (``jsonschema``, with formats): nested objects, arrays,
        ranges and patterns, not only the top-level types.

        Raises:
            ToolArgumentsInvalid: On a missing required argument, an unknown one (when the schema
                forbids extras), or any value the schema rejects (naming its path and why).
        """
        schema = self.parameters
        properties: dict[str, Any] = schema.get("properties", {})
        missing = [name for name in schema.get("required", []) if name not in arguments]
        if missing:
            raise ToolArgumentsInvalid(
                f"tool {self.name!r} needs {missing}; got {sorted(arguments)}. Pass every required argument"
            )
        unknown = sorted(set(arguments) - set(properties))
        if unknown and schema.get("additionalProperties", True) is False:
            raise ToolArgumentsInvalid(f"tool {self.name!r} takes {sorted(properties)}; {unknown} are not among them")
        errors = _validator(json.dumps(schema, sort_keys=True)).iter_errors(arguments)
        first = min(errors, key=_order, default=None)
        if first is not None:
            raise ToolArgumentsInvalid(_explained(self.name, first))
        defaults = {name: spec["default"] for name, spec in properties.items() if "default" in spec}
        return {**defaults, **arguments}


@lru_cache(maxsize=256)
def _validator(schema: str) -> Any:
    """A JSON-schema validator (with format checks) for a tool's parameters, built once per schema."""
    import jsonschema  # imported on first use: importing metaroles stays fast

    parsed = json.loads(schema)
    kind = jsonschema.validators.validator_for(parsed)
    try:
        kind.check_schema(parsed)
    except jsonschema.SchemaError as exc:
        raise ToolArgumentsInvalid(f"the tool's parameters are not a valid JSON schema: {exc.message}") from None
    return kind(parsed, format_checker=kind.FORMAT_CHECKER)


def _order(error: Any) -> tuple[int, str]:
    return (len(error.absolute_path), str(list(error.absolute_path)))


def _explained(tool: str, error: Any) -> str:
    """One line: which argument (its path inside nested objects and arrays), its value, and what is wrong."""
    path = "".join(
        f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(error.absolute_path)
    )
    where = f"argument {path!r}={error.instance!r}" if path else f"arguments {error.instance!r}"
    if error.validator == "type":
        types = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        return f"tool {tool!r}: {where} must be of JSON type {' or '.join(types)}"
    if error.validator == "enum":
        return f"tool {tool!r}: {where} must be one of {error.validator_value}"
    return f"tool {tool!r}: {where}: {error.message}"


class ToolCollection:
    """Tools by name; executes a call and turns every failure into a :class:`ToolFailure`.

    Raises:
        DuplicateToolError: If two tools share a name (nothing is added then).
    """

    def __init__(self, *tools: BaseTool) -> None:
        """Hold ``tools``."""
        self.tool_map: dict[str, BaseTool] = {}
        self.add_tools(*tools)

    @property
    def tools(self) -> tuple[BaseTool, ...]:
        """The tools, in the order they were added."""
        return tuple(self.tool_map.values())

    def __iter__(self) -> Iterator[BaseTool]:
        """Iterate over the tools."""
        return iter(self.tool_map.values())

    def __len__(self) -> int:
        """Return how many tools there are."""
        return len(self.tool_map)

    def to_params(self) -> list[dict[str, Any]]:
        """Every tool in the OpenAI function-calling format."""
        return [tool.to_param() for tool in self.tool_map.values()]

    def get_tool(self, name: str) -> BaseTool | None:
        """The tool called ``name``, if any."""
        return self.tool_map.get(name)

    def add_tool(self, tool: BaseTool) -> ToolCollection:
        """Add ``tool``.

        Raises:
            DuplicateToolError: If a tool with its name is already here.
        """
        return self.add_tools(tool)

    def add_tools(self, *tools: BaseTool) -> ToolCollection:
        """Add ``tools``; all or none.

        Raises:
            DuplicateToolError: If a name is already here or repeats among ``tools``.
        """
        names = [tool.name for tool in tools]
        clashes = sorted({n for n in names if n in self.tool_map or names.count(n) > 1})
        if clashes:
            raise DuplicateToolError(f"tool name(s) {clashes} already taken; give each tool a unique name")
        for tool in tools:
            self.tool_map[tool.name] = tool
        return self

    async def execute(self, *, name: str, tool_input: dict[str, Any] | None = None) -> ToolResult:
        """Run tool ``name``; an unknown tool, bad arguments or a ToolError give a ToolFailure."""
        tool = self.tool_map.get(name)
        if tool is None:
            return ToolFailure(error=f"tool {name!r} is unknown; available: {sorted(self.tool_map)}")
        try:
            result = await tool(**(tool_input or {}))
        except (ToolArgumentsInvalid, ToolError) as exc:
            return ToolFailure(error=str(exc))
        return result if isinstance(result, ToolResult) else ToolResult(output=result)

    async def execute_all(self) -> list[ToolResult]:
        """Run every tool with no arguments, in order."""
        return [await self.execute(name=name) for name in self.tool_map]


class Terminate(BaseTool):
    """Ends the agent's run: a special tool (its call sets the agent FINISHED)."""

    NAME: ClassVar[str] = "terminate"

    name: str = NAME
    description: str = (
        "Terminate the interaction when the request is met OR if you cannot proceed further with the task. "
        "When you have finished all the tasks, call this tool to end the work."
    )
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {
            "type": "object",
            "properties": {
                "status": {
                    "type": "string",
                    "description": "The finish status of the interaction, e.g. success or failure (free text).",
                }
            },
            "required": ["status"],
        }
    )

    async def execute(self, **arguments: Any) -> Any:
        """Report the status."""
        return f"The interaction has been completed with status: {arguments['status']}"
