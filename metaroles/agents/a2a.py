"""Agents across processes with A2A v1.0 (the ``a2a-sdk``): serve a role as an agent, bring a remote one in.

:func:`role_app` serves any :class:`~metaroles.bus.role.Role` as an A2A agent: its agent card at
the well-known path (``/.well-known/agent-card.json``), JSON-RPC at ``/``, streaming (Server-Sent
Events) as the card says. Each message the agent is sent is put to the role as a message from
the caller (caused by the first action it watches) and the role takes one turn; what it says is
the task's artifact, streamed as it comes. :class:`RoleServer` runs the app on 127.0.0.1.

:class:`A2AAgent` is a remote agent as a run sees it: its card resolved when the run starts (a
dead URL is one line naming it), every exchange recorded on the run's :class:`ToolCassette` and
answered from it on replay, with no agent there. :class:`A2ARole` makes it a member of a society:
its news go to the remote agent, whose answer it publishes.
"""

from __future__ import annotations

import hashlib
import socket
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio

from metaroles.agents.mcp import ToolCassette, renamed_tape
from metaroles.agents.spans import Continued, client_span, trace_context
from metaroles.agents.tool import ToolFailure, ToolResult
from metaroles.bus.action import Action, ActionResult, UserRequirement
from metaroles.bus.role import Role
from metaroles.core.exceptions import ConfigError, RunError
from metaroles.core.guard import Guarded, kept_answer
from metaroles.core.installed import version
from metaroles.core.schema import MESSAGE_ROUTE_TO_ALL
from metaroles.core.text import redacted, scrubbed
from metaroles.messages.message import Message

if TYPE_CHECKING:
    from collections.abc import Sequence


__all__ = ["A2AAgent", "A2AAgentGone", "A2ARole", "AskAgent", "RoleServer", "role_app"]

AGENT_SECONDS = 120.0
"""How long a remote agent has to answer one message (``A2AAgent(timeout=...)``)."""

CARD_PATH = "/.well-known/agent-card.json"
"""Where an A2A agent's card is served (the protocol's well-known path)."""
BINDINGS = ("JSONRPC", "HTTP+JSON")
"""The A2A 1.0 bindings a served role answers on, in the order of its preference."""


class A2AAgentGone(RunError):
    """A remote A2A agent stopped answering during the run: the run stops, resumable."""


def _card(role: Role, url: str) -> Any:
    """The role's A2A 1.0 agent card: who it is, where and how it answers, and its actions as skills."""
    from a2a.types import AgentCapabilities, AgentCard, AgentInterface

    about = f"{role.name}, {role.profile or 'a role'} of a metaroles society"
    return AgentCard(
        name=role.name,
        description=f"{about}: {role.goal}" if role.goal else about,
        supported_interfaces=[  # JSON-RPC first (preferred); HTTP+JSON answers as application/a2a+json
            AgentInterface(url=url, protocol_binding=binding, protocol_version="1.0") for binding in BINDINGS
        ],
        version=version("metaroles") or "0",
        capabilities=AgentCapabilities(streaming=True, push_notifications=False, extended_agent_card=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[_skill(role, action) for action in role.actions] or [_skill(role, None)],
    )


def _skill(role: Role, action: Action | None) -> Any:
    """An action of the role as an A2A skill (its id the messages' ``cause_by``; JSON out if it answers structured)."""
    from a2a.types import AgentSkill

    if action is None:
        return AgentSkill(id=role.name, name=role.name, description=f"talks as {role.name}", tags=["metaroles"])
    doc = (type(action).__doc__ or "").strip().partition("\n")[0]
    structured = action.output_model is not None
    return AgentSkill(
        id=action.action_id(),
        name=action.name,
        description=action.desc or doc or f"{action.name}, as {role.name} does it",
        tags=["metaroles", "structured" if structured else "text"],
        input_modes=["text/plain"],
        output_modes=["application/json" if structured else "text/plain"],
    )


class _Served:
    """A role answering A2A messages one at a time: each a turn of its own."""

    def __init__(self, role: Role) -> None:
        self.role = role
        self.lock = anyio.Lock()
        watched, asked = sorted(role.rc.watch), UserRequirement.action_id()
        self.cause_by = asked if asked in watched or not watched else watched[0]  # a message the role hears

    async def answer(self, text: str) -> str:
        async with self.lock:  # one turn at a time: the role's memory is one conversation
            message = Message(text, sent_from="a2a", send_to=self.role.name, cause_by=self.cause_by)
            said = await self.role.run(message)
        return (said.content or "") if said is not None else ""


def _executor(served: _Served) -> Any:
    from a2a.helpers import new_task_from_user_message
    from a2a.server.agent_execution import AgentExecutor
    from a2a.server.tasks import TaskUpdater
    from a2a.types import Part

    class RoleExecutor(AgentExecutor):
        async def execute(self, context: Any, event_queue: Any) -> None:
            if context.current_task is None:
                await event_queue.enqueue_event(new_task_from_user_message(context.message))
            updater = TaskUpdater(event_queue, context.task_id, context.context_id)
            await updater.start_work()
            text = await served.answer(context.get_user_input())
            await updater.add_artifact([Part(text=text)], name=served.role.name, last_chunk=True)
            await updater.complete()

        async def cancel(self, context: Any, event_queue: Any) -> None:
            await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()

    return RoleExecutor()


def role_app(role: Role, url: str) -> Continued:
    """The A2A app of ``role``, to be served at ``url``: its card, JSON-RPC at ``/`` and HTTP+JSON beside it.

    The card is at the well-known path; HTTP+JSON is ``POST /message:send``, ``/message:stream``,
    ``GET /tasks/{id}``…, answered as ``application/a2a+json``. A request is answered inside the trace
    it carries (:class:`~metaroles.agents.spans.Continued`).
    """
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
    from a2a.server.tasks import InMemoryTaskStore
    from starlette.applications import Starlette

    card = _card(role, url)
    handler = DefaultRequestHandler(agent_executor=_executor(_Served(role)), task_store=InMemoryTaskStore(),
                                    agent_card=card)  # fmt: skip
    routes = [*create_agent_card_routes(card), *create_jsonrpc_routes(handler, rpc_url="/")]
    return Continued(Starlette(routes=[*routes, *create_rest_routes(handler)]))


class RoleServer:
    """``role`` served as an A2A agent on 127.0.0.1 (``port`` 0: any free one) by uvicorn in a thread; ``url``.

    Use as a context manager, or call :meth:`stop`.
    """

    def __init__(self, role: Role, *, port: int = 0, sock: socket.socket | None = None) -> None:
        import uvicorn

        self.sock = sock or socket.create_server(("127.0.0.1", port))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(Guarded(role_app(role, self.url)), log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Stop serving (what is being answered is cut short)."""
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()

    def __enter__(self) -> RoleServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class A2AAgent:
    """A remote A2A agent a run talks to: its card resolved on entering (``async with``), its exchanges recorded.

    Args:
        name: The agent's name in the run (the member's role name).
        url: Where it is served (its card at ``URL/.well-known/agent-card.json``).
        cassette: Record every exchange (``record``), or answer from it and reach nobody (``replay``; ``tape=``
            before: still taken, with a ``DeprecationWarning``).
        timeout: Seconds the agent has to answer one message.
    """

    def __init__(
        self,
        name: str,
        url: str,
        *,
        cassette: ToolCassette | None = None,
        timeout: float = AGENT_SECONDS,
        tape: ToolCassette | None = None,
    ) -> None:
        cassette = renamed_tape(tape, cassette)
        self.name, self.url, self.cassette, self.timeout = name, url.rstrip("/"), cassette, timeout
        self.description = ""
        self._client: Any = None
        self._http: Any = None

    @property
    def replaying(self) -> bool:
        """Whether the agent is answered from the cassette (nobody is reached)."""
        return self.cassette is not None and self.cassette.mode == "replay"

    async def __aenter__(self) -> A2AAgent:
        if self.replaying:
            assert self.cassette is not None
            self.description = self.cassette.card(self.name).get("description", "")
            return self
        import httpx
        from a2a.client import A2ACardResolver, ClientConfig, create_client
        from google.protobuf.json_format import MessageToDict

        self._http = httpx.AsyncClient(timeout=self.timeout, event_hooks={"request": [_traced]})
        try:
            with anyio.fail_after(self.timeout):
                found = await A2ACardResolver(self._http, self.url).get_agent_card()
            self._client = await create_client(found, ClientConfig(streaming=True, httpx_client=self._http))
        except Exception as exc:
            await self._http.aclose()
            raise ConfigError(
                f"A2A agent {self.name!r} has no card at {redacted(self.url)}{CARD_PATH} "
                f"({type(exc).__name__}: {scrubbed(str(exc))}); "
                "start it, or fix the URL"
            ) from None
        card = MessageToDict(found)
        self.description = str(card.get("description", ""))
        if self.cassette is not None:
            self.cassette.write({"kind": "card", "agent": self.name, "url": redacted(self.url), "card": card})
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._client is not None:
            await self._client.close()
        if self._http is not None:
            await self._http.aclose()

    async def send(self, text: str) -> ToolResult:
        """Send ``text``; the agent's answer (its artifacts' and messages' text), or a failure it reported.

        Raises:
            A2AAgentGone: If the agent stopped answering.
        """
        if self.cassette is None:
            return await self._exchange(text)
        return await self.cassette.through(self.name, "send_message", {"text": text}, lambda: self._exchange(text))

    async def _exchange(self, text: str) -> ToolResult:
        from a2a.types import Message as A2AMessage
        from a2a.types import Part, SendMessageRequest
        from a2a.types import Role as A2ARoleKind

        message_id = hashlib.sha256(f"{self.name}\n{text}".encode()).hexdigest()[:32]
        request = SendMessageRequest(message=A2AMessage(role=A2ARoleKind.ROLE_USER, parts=[Part(text=text)],
                                                        message_id=message_id))  # fmt: skip
        texts: list[str] = []
        failed = ""
        where = urlsplit(self.url)
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": self.name,
            "rpc.system": "jsonrpc",
            "rpc.method": "SendStreamingMessage",
            "server.address": where.hostname,
            "server.port": where.port,
        }
        try:
            with client_span(f"invoke_agent {self.name}", attributes), anyio.fail_after(self.timeout):
                async for event in self._client.send_message(request):
                    failed = _read(event, texts) or failed
        except TimeoutError:
            return ToolFailure(error=f"A2A agent {self.name!r} gave no answer in {self.timeout:g} s")
        except Exception as exc:
            raise A2AAgentGone(
                f"A2A agent {self.name!r} at {redacted(self.url)} stopped answering "
                f"({type(exc).__name__}: {scrubbed(str(exc))}); "
                "resume the run once it runs again"
            ) from None
        if failed:
            return ToolFailure(error=f"A2A agent {self.name!r}: {failed}")
        return ToolResult(output=kept_answer("\n".join(texts), source=f"A2A agent {self.name!r}"))


async def _traced(request: Any) -> None:
    """Give an HTTP request to an agent the current span's trace context (its ``traceparent`` header)."""
    request.headers.update(trace_context() or {})


def _read(event: Any, texts: list[str]) -> str:
    """Add the text an A2A stream event carries to ``texts``; a failure's text if the task failed."""
    from a2a.types import TaskState

    if event.HasField("artifact_update"):
        texts += [part.text for part in event.artifact_update.artifact.parts if part.text]
    elif event.HasField("message"):
        texts += [part.text for part in event.message.parts if part.text]
    elif event.HasField("status_update"):
        status = event.status_update.status
        if status.state in (TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_REJECTED, TaskState.TASK_STATE_CANCELED):
            return " ".join(part.text for part in status.message.parts if part.text) or "the task did not complete"
    elif event.HasField("task"):
        for artifact in event.task.artifacts:
            texts += [part.text for part in artifact.parts if part.text]
    return ""


class AskAgent(Action):
    """Puts a role's news to its remote agent; the agent's answer is the result."""

    def __init__(self, agent: A2AAgent) -> None:
        """Ask ``agent``."""
        super().__init__(name=f"Ask{agent.name}")
        self.agent = agent
        self.owner: Role | None = None

    async def run(self, history: Sequence[Message]) -> ActionResult:
        """Send the owner's news (else the newest message) to the agent; its answer, or why it gave none."""
        news = list(self.owner.rc.news) if self.owner is not None else []
        news = news or list(history[-1:])
        text = "\n".join(f"{m.sent_from or 'user'}: {m.content}" for m in news)
        result = await self.agent.send(text)
        return result.output if result.error is None else f"(no answer: {result.error})"


class A2ARole(Role):
    """A remote A2A agent as a member of a society: what it watches goes to the agent; it says the answer.

    Args:
        agent: The remote agent (entered before the run: its card resolved, or its cassette read).
        watch: Actions whose messages it hears (default: the user's requirement, the run's idea).
        send_to: Where its answers go (default: everyone).
    """

    def __init__(self, agent: A2AAgent, *, watch: Iterable[Any] | None = None, send_to: Any = None) -> None:
        """Seat ``agent`` on the bus under its name."""
        action = AskAgent(agent)
        super().__init__(
            name=agent.name,
            profile=agent.description[:200] or "a remote A2A agent",
            actions=[action],
            watch=watch if watch is not None else [UserRequirement],
            send_to=send_to if send_to is not None else MESSAGE_ROUTE_TO_ALL,
        )
        action.owner = self
        self.agent = agent
