"""metaroles: a MetaGPT-style multi-role message bus for agent simulations.

Importing this package reads no environment, writes no file and imports no provider SDK,
faiss, llama-index or ray; each public name's module is imported when the name is first used
(``from metaroles import Role``), so ``import metaroles`` and the ``metaroles`` command start fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names as type checkers see them; at run time each comes from __getattr__
    from metaroles.agents.agent import BaseAgent, ReActAgent, ToolCallAgent
    from metaroles.agents.agent_role import AgentRole, PublishMessage
    from metaroles.agents.sandbox import FileRead, FileWrite, PythonExecute
    from metaroles.agents.tool import BaseTool, CLIResult, Terminate, ToolCollection, ToolFailure, ToolResult
    from metaroles.bus.action import Action, ActionOutput, ActionResult, UserRequirement
    from metaroles.bus.context import RoleContext, RoleReactMode
    from metaroles.bus.delivery import Bus
    from metaroles.bus.environment import Environment
    from metaroles.bus.record import EnvEvent
    from metaroles.bus.role import HumanRole, Role
    from metaroles.bus.routing import (
        DeadLetterWarning,
        DropMessage,
        Intervention,
        RouteExplanation,
        UnheardWatchWarning,
    )
    from metaroles.bus.state import EnvironmentState, RoleState
    from metaroles.core.exceptions import (
        AgentStateError,
        ConfigError,
        DuplicateRoleError,
        DuplicateToolError,
        InvalidValueError,
        LLMOutputInvalid,
        MetarolesError,
        PortingNote,
        ProviderError,
        RoleFailed,
        RunError,
        ScriptExhausted,
        ToolArgumentsInvalid,
        ToolCallMissing,
        ToolError,
        UndeliverableError,
        UnknownRoleError,
        UserError,
    )
    from metaroles.core.schema import (
        MESSAGE_ROUTE_TO_ALL,
        AgentState,
        ChatRole,
        Function,
        RoleName,
        ToolCall,
        ToolChoice,
        any_to_name,
        any_to_str,
    )
    from metaroles.llm.ledger import Budget, CostLedger, LedgerEntry, Price, Spend
    from metaroles.llm.offline import FunctionLLM, ScriptedLLM, TestLLM
    from metaroles.llm.protocol import LLM, LLMRequest, LLMResponse, Usage
    from metaroles.llm.providers import resolve_llm
    from metaroles.messages.memory import ChatMemory, Memory
    from metaroles.messages.message import AIMessage, Message, SystemMessage, UserMessage
    from metaroles.messages.queue import MessageQueue, PriorityMessageQueue
    from metaroles.project.interview import interview_run
    from metaroles.project.registry import ScenarioPlan, load_scenario
    from metaroles.project.scenario import fork_scenario, resume_scenario, run_scenario
    from metaroles.project.sweep import sweep
    from metaroles.sharding.backends import LocalBackend
    from metaroles.sharding.cast import Cast
    from metaroles.sharding.ray import RayBackend
    from metaroles.team.control import Injection, RunControl
    from metaroles.team.team import StopReason, Team, TeamReport

__all__ = [
    "LLM",
    "MESSAGE_ROUTE_TO_ALL",
    "AIMessage",
    "Action",
    "ActionOutput",
    "ActionResult",
    "AgentRole",
    "AgentState",
    "AgentStateError",
    "BaseAgent",
    "BaseTool",
    "Budget",
    "Bus",
    "CLIResult",
    "Cast",
    "ChatMemory",
    "ChatRole",
    "ConfigError",
    "CostLedger",
    "DeadLetterWarning",
    "DropMessage",
    "DuplicateRoleError",
    "DuplicateToolError",
    "EnvEvent",
    "Environment",
    "EnvironmentState",
    "FileRead",
    "FileWrite",
    "Function",
    "FunctionLLM",
    "HumanRole",
    "Injection",
    "Intervention",
    "InvalidValueError",
    "LLMOutputInvalid",
    "LLMRequest",
    "LLMResponse",
    "LedgerEntry",
    "LocalBackend",
    "Memory",
    "Message",
    "MessageQueue",
    "MetarolesError",
    "PortingNote",
    "Price",
    "PriorityMessageQueue",
    "ProviderError",
    "PublishMessage",
    "PythonExecute",
    "RayBackend",
    "ReActAgent",
    "Role",
    "RoleContext",
    "RoleFailed",
    "RoleName",
    "RoleReactMode",
    "RoleState",
    "RouteExplanation",
    "RunControl",
    "RunError",
    "ScenarioPlan",
    "ScriptExhausted",
    "ScriptedLLM",
    "Spend",
    "StopReason",
    "SystemMessage",
    "Team",
    "TeamReport",
    "Terminate",
    "TestLLM",
    "ToolArgumentsInvalid",
    "ToolCall",
    "ToolCallAgent",
    "ToolCallMissing",
    "ToolChoice",
    "ToolCollection",
    "ToolError",
    "ToolFailure",
    "ToolResult",
    "UndeliverableError",
    "UnheardWatchWarning",
    "UnknownRoleError",
    "Usage",
    "UserError",
    "UserMessage",
    "UserRequirement",
    "any_to_name",
    "any_to_str",
    "fork_scenario",
    "interview_run",
    "load_scenario",
    "resolve_llm",
    "resume_scenario",
    "run_scenario",
    "sweep",
]

_WHERE: dict[str, str] = {
    "LLM": "metaroles.llm.protocol",
    "MESSAGE_ROUTE_TO_ALL": "metaroles.core.schema",
    "AIMessage": "metaroles.messages.message",
    "Action": "metaroles.bus.action",
    "ActionOutput": "metaroles.bus.action",
    "ActionResult": "metaroles.bus.action",
    "AgentRole": "metaroles.agents.agent_role",
    "AgentState": "metaroles.core.schema",
    "AgentStateError": "metaroles.core.exceptions",
    "BaseAgent": "metaroles.agents.agent",
    "BaseTool": "metaroles.agents.tool",
    "Budget": "metaroles.llm.ledger",
    "Bus": "metaroles.bus.delivery",
    "CLIResult": "metaroles.agents.tool",
    "Cast": "metaroles.sharding.cast",
    "ChatMemory": "metaroles.messages.memory",
    "ChatRole": "metaroles.core.schema",
    "ConfigError": "metaroles.core.exceptions",
    "CostLedger": "metaroles.llm.ledger",
    "DeadLetterWarning": "metaroles.bus.routing",
    "DropMessage": "metaroles.bus.routing",
    "DuplicateRoleError": "metaroles.core.exceptions",
    "DuplicateToolError": "metaroles.core.exceptions",
    "EnvEvent": "metaroles.bus.record",
    "Environment": "metaroles.bus.environment",
    "EnvironmentState": "metaroles.bus.state",
    "FileRead": "metaroles.agents.sandbox",
    "FileWrite": "metaroles.agents.sandbox",
    "Function": "metaroles.core.schema",
    "FunctionLLM": "metaroles.llm.offline",
    "HumanRole": "metaroles.bus.role",
    "Injection": "metaroles.team.control",
    "Intervention": "metaroles.bus.routing",
    "InvalidValueError": "metaroles.core.exceptions",
    "LLMOutputInvalid": "metaroles.core.exceptions",
    "LLMRequest": "metaroles.llm.protocol",
    "LLMResponse": "metaroles.llm.protocol",
    "LedgerEntry": "metaroles.llm.ledger",
    "LocalBackend": "metaroles.sharding.backends",
    "Memory": "metaroles.messages.memory",
    "Message": "metaroles.messages.message",
    "MessageQueue": "metaroles.messages.queue",
    "MetarolesError": "metaroles.core.exceptions",
    "PortingNote": "metaroles.core.exceptions",
    "Price": "metaroles.llm.ledger",
    "PriorityMessageQueue": "metaroles.messages.queue",
    "ProviderError": "metaroles.core.exceptions",
    "PublishMessage": "metaroles.agents.agent_role",
    "PythonExecute": "metaroles.agents.sandbox",
    "RayBackend": "metaroles.sharding.ray",
    "ReActAgent": "metaroles.agents.agent",
    "Role": "metaroles.bus.role",
    "RoleContext": "metaroles.bus.context",
    "RoleFailed": "metaroles.core.exceptions",
    "RoleName": "metaroles.core.schema",
    "RoleReactMode": "metaroles.bus.context",
    "RoleState": "metaroles.bus.state",
    "RouteExplanation": "metaroles.bus.routing",
    "RunControl": "metaroles.team.control",
    "RunError": "metaroles.core.exceptions",
    "ScenarioPlan": "metaroles.project.registry",
    "ScriptExhausted": "metaroles.core.exceptions",
    "ScriptedLLM": "metaroles.llm.offline",
    "Spend": "metaroles.llm.ledger",
    "StopReason": "metaroles.team.team",
    "SystemMessage": "metaroles.messages.message",
    "Team": "metaroles.team.team",
    "TeamReport": "metaroles.team.team",
    "Terminate": "metaroles.agents.tool",
    "TestLLM": "metaroles.llm.offline",
    "ToolArgumentsInvalid": "metaroles.core.exceptions",
    "ToolCall": "metaroles.core.schema",
    "ToolCallAgent": "metaroles.agents.agent",
    "ToolCallMissing": "metaroles.core.exceptions",
    "ToolChoice": "metaroles.core.schema",
    "ToolCollection": "metaroles.agents.tool",
    "ToolError": "metaroles.core.exceptions",
    "ToolFailure": "metaroles.agents.tool",
    "ToolResult": "metaroles.agents.tool",
    "UndeliverableError": "metaroles.core.exceptions",
    "UnheardWatchWarning": "metaroles.bus.routing",
    "UnknownRoleError": "metaroles.core.exceptions",
    "Usage": "metaroles.llm.protocol",
    "UserError": "metaroles.core.exceptions",
    "UserMessage": "metaroles.messages.message",
    "UserRequirement": "metaroles.bus.action",
    "any_to_name": "metaroles.core.schema",
    "any_to_str": "metaroles.core.schema",
    "fork_scenario": "metaroles.project.scenario",
    "interview_run": "metaroles.project.interview",
    "load_scenario": "metaroles.project.registry",
    "resolve_llm": "metaroles.llm.providers",
    "resume_scenario": "metaroles.project.scenario",
    "run_scenario": "metaroles.project.scenario",
    "sweep": "metaroles.project.sweep",
}
"""Each public name, and the module that defines it."""


def __getattr__(name: str) -> Any:
    """Import a public name's module the first time the name is asked for, and keep the name here."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'metaroles' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names (and the module's own)."""
    return sorted({*globals(), *__all__})
