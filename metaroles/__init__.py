"""metaroles: a MetaGPT-style multi-role message bus for agent simulations.

Importing this package reads no environment, writes no file and imports no provider SDK,
faiss, llama-index or ray.
"""

from metaroles.agents.agent import BaseAgent, ReActAgent, ToolCallAgent
from metaroles.agents.agent_role import AgentRole, PublishMessage
from metaroles.agents.sandbox import FileRead, FileWrite, PythonExecute
from metaroles.agents.tool import BaseTool, CLIResult, Terminate, ToolCollection, ToolFailure, ToolResult
from metaroles.bus.action import Action, ActionOutput, ActionResult, UserRequirement
from metaroles.bus.context import RoleContext, RoleReactMode
from metaroles.bus.delivery import Bus
from metaroles.bus.environment import Environment
from metaroles.bus.record import EnvEvent
from metaroles.bus.role import Role
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
from metaroles.project.registry import ScenarioPlan, load_scenario
from metaroles.project.scenario import fork_scenario, resume_scenario, run_scenario
from metaroles.project.sweep import sweep
from metaroles.sharding.backends import LocalBackend
from metaroles.sharding.cast import Cast
from metaroles.sharding.ray import RayBackend
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
    "load_scenario",
    "resolve_llm",
    "resume_scenario",
    "run_scenario",
    "sweep",
]
