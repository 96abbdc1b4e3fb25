"""metaroles: a MetaGPT-style multi-role message bus for agent simulations.

Importing this package reads no environment, writes no file and imports no provider SDK,
faiss, llama-index or ray.
"""

from metaroles.action import Action, ActionResult, UserRequirement
from metaroles.agent import BaseAgent, ReActAgent, ToolCallAgent
from metaroles.agent_role import AgentRole, PublishMessage
from metaroles.environment import (
    DeadLetterWarning,
    DropMessage,
    Environment,
    Intervention,
    RouteExplanation,
)
from metaroles.exceptions import (
    AgentStateError,
    ConfigError,
    DuplicateRoleError,
    DuplicateToolError,
    InvalidValueError,
    LLMOutputInvalid,
    MetarolesError,
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
from metaroles.ledger import Budget, CostLedger, LedgerEntry, Price, Spend
from metaroles.llm import LLM, LLMRequest, LLMResponse, Usage
from metaroles.memory import ChatMemory, Memory
from metaroles.message import Message
from metaroles.offline import FunctionLLM, ScriptedLLM, TestLLM
from metaroles.providers import resolve_llm
from metaroles.queue import MessageQueue, PriorityMessageQueue
from metaroles.role import Role
from metaroles.role_context import RoleContext, RoleReactMode
from metaroles.sandbox import FileRead, FileWrite, PythonExecute
from metaroles.schema import (
    MESSAGE_ROUTE_TO_ALL,
    AgentState,
    ChatRole,
    Function,
    ToolCall,
    ToolChoice,
    any_to_str,
)
from metaroles.state import EnvEvent, EnvironmentState, RoleState
from metaroles.team import StopReason, Team, TeamReport
from metaroles.tool import BaseTool, Terminate, ToolCollection, ToolFailure, ToolResult

__all__ = [
    "LLM",
    "MESSAGE_ROUTE_TO_ALL",
    "Action",
    "ActionResult",
    "AgentRole",
    "AgentState",
    "AgentStateError",
    "BaseAgent",
    "BaseTool",
    "Budget",
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
    "Intervention",
    "InvalidValueError",
    "LLMOutputInvalid",
    "LLMRequest",
    "LLMResponse",
    "LedgerEntry",
    "Memory",
    "Message",
    "MessageQueue",
    "MetarolesError",
    "Price",
    "PriorityMessageQueue",
    "ProviderError",
    "PublishMessage",
    "PythonExecute",
    "ReActAgent",
    "Role",
    "RoleContext",
    "RoleFailed",
    "RoleReactMode",
    "RoleState",
    "RouteExplanation",
    "RunError",
    "ScriptExhausted",
    "ScriptedLLM",
    "Spend",
    "StopReason",
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
    "UnknownRoleError",
    "Usage",
    "UserError",
    "UserRequirement",
    "any_to_str",
    "resolve_llm",
]
