"""The metaroles exception tree.

Every error metaroles raises on purpose derives from :class:`MetarolesError`::

    MetarolesError
    ├── UserError                 a developer mistake: fix the call, the config or the script
    │   ├── InvalidValueError     a value of the wrong type or out of range (names the value)
    │   ├── DuplicateRoleError    a role name used twice in one Environment
    │   ├── UnknownRoleError      a role name that the Environment does not know
    │   ├── ConfigError           an unknown provider name, a script file that does not parse
    │   ├── UndeliverableError    strict mode: a message whose ``send_to`` meets no role
    │   ├── DuplicateToolError    two tools with one name in a ToolCollection
    │   ├── ToolArgumentsInvalid  a tool called with arguments its JSON schema rejects
    │   └── AgentStateError       an agent asked to run from a state other than IDLE
    └── RunError                  the run itself failed; the run's state is kept
        ├── ProviderError         a model server failed past the retries, or refused the request
        │   ├── EndpointUnreachable   nothing listens at its URL
        │   └── EndpointBusy          it refused for load (429, 503) or did not answer in time
        ├── LLMOutputInvalid      the model's answer did not validate after the retries
        ├── ScriptExhausted       a ScriptedLLM has no response left for a role and action
        ├── RoleFailed            a role raised during a round (the original is ``__cause__``)
        ├── ToolError             a tool could not do its job (becomes a ToolFailure observation)
        └── ToolCallMissing       tool_choice=REQUIRED, and the model called no tool

Messages name the offending value with ``!r`` and say what to do about it. Where the MetaGPT and
OpenManus designs raise a builtin, ours subclass it too, so ported ``except`` clauses still catch:
a bad value (:class:`InvalidValueError`, :class:`ConfigError`) is a ``ValueError``, an agent run
from the wrong state (:class:`AgentStateError`) and a failed run (:class:`RunError`) are
``RuntimeError``s, an unknown role is a ``KeyError``.
"""

from __future__ import annotations


class MetarolesError(Exception):
    """Base class of every error raised by metaroles."""


class UserError(MetarolesError):
    """A developer mistake: a bad argument, configuration or script."""


class InvalidValueError(UserError, ValueError):
    """A value of the wrong type or out of range."""


class DuplicateRoleError(UserError):
    """A role name used twice in one Environment."""


class UnknownRoleError(UserError):
    """A role name the Environment does not know."""


class ConfigError(UserError, ValueError):
    """A configuration value that cannot be used (unknown provider, unparsable file)."""


class RunDirCorrupt(ConfigError):
    """A file of a run directory that cannot be read whole (garbage, wrong types, missing); names file and line."""


class UndeliverableError(UserError):
    """Strict mode: a published message whose ``send_to`` meets no role."""


class DuplicateToolError(UserError):
    """Two tools with one name in a ToolCollection."""


class ToolArgumentsInvalid(InvalidValueError):
    """A tool called with arguments its JSON schema rejects."""


class AgentStateError(UserError, RuntimeError):
    """An agent asked to run from a state other than IDLE."""


class RunError(MetarolesError, RuntimeError):
    """A failure of the run itself, as opposed to a mistake in how it was set up."""


class ProviderError(RunError):
    """A model server failed past the retries (429, 5xx, timeouts), or refused the request (4xx)."""


class EndpointUnreachable(ProviderError):
    """No connection to a model server could be made, past the retries (nothing listens at its URL)."""


class EndpointBusy(ProviderError):
    """A model server refused for load (429, 5xx) or did not answer in time, past the retries.

    Attributes:
        retry_after: Seconds the server asked to be left alone for, if it said.
    """

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class LLMOutputInvalid(RunError):
    """The model's answer did not validate against the requested output model.

    Attributes:
        raw: The last raw text the model returned.
        errors: The validation error text of the last attempt.
    """

    def __init__(self, message: str, *, raw: str, errors: str) -> None:
        super().__init__(message)
        self.raw = raw
        self.errors = errors


class ScriptExhausted(RunError):
    """A :class:`~metaroles.llm.offline.ScriptedLLM` has no response left."""


class RoleFailed(RunError):
    """A role raised during a round; the original exception is ``__cause__``.

    Attributes:
        role: Name of the role that failed.
        round: The round in which it failed.
    """

    def __init__(self, message: str, *, role: str, round: int) -> None:
        super().__init__(message)
        self.role = role
        self.round = round


class ToolError(RunError):
    """A tool could not do its job; agents observe it as a ``ToolFailure``."""


class ToolCallMissing(RunError):
    """``tool_choice`` was REQUIRED and the model called no tool."""


class PortingNote(UserWarning):
    """A MetaGPT or OpenManus idiom that metaroles accepted by translating it (said once per call site)."""


def raised_at(exc: BaseException, *, frames: int = 8) -> list[str]:
    """Where ``exc`` was raised: its last ``frames`` frames, innermost last, as ``module:line in function``."""
    found = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        found.append(f"{tb.tb_frame.f_globals.get('__name__', '?')}:{tb.tb_lineno} in {code.co_name}")
        tb = tb.tb_next
    return found[-frames:]


def raised_in(exc: BaseException) -> str:
    """`` at FILE:LINE`` of the innermost frame that raised ``exc`` (``""`` without a traceback): for a message."""
    tb = exc.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
