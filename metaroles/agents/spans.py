"""Client spans for the calls a run makes out of its process (MCP tools, A2A agents), and the context they carry.

Through the OpenTelemetry API alone: a run traced with ``--otel`` (or a user's own tracer provider)
receives them as children of the turn that made the call, named and attributed as the semantic
conventions say (MCP: ``{mcp.method.name} {target}``, ``mcp.method.name``, ``mcp.protocol.version``;
a remote agent: ``invoke_agent {gen_ai.agent.name}``, kind CLIENT). The call carries the span as W3C
trace context (``traceparent``) — in an MCP request's ``_meta``, in an A2A request's headers — so
the server's own spans join the run's trace. Without OpenTelemetry, or outside a trace, nothing is
made and nothing is sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def client_span(name: str, attributes: dict[str, Any]) -> Iterator[None]:
    """A CLIENT span ``name`` around the block, current inside it (no attribute whose value is ``None``)."""
    try:
        from opentelemetry import trace
    except ImportError:
        yield
        return
    kept = {key: value for key, value in attributes.items() if value is not None}
    with trace.get_tracer("metaroles").start_as_current_span(name, kind=trace.SpanKind.CLIENT, attributes=kept):
        yield


def trace_context() -> dict[str, str] | None:
    """The current span's context as W3C headers (``traceparent``); ``None`` without OpenTelemetry or a trace."""
    try:
        from opentelemetry import propagate
    except ImportError:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None


class Continued:
    """An ASGI app served inside the trace each request's headers carry (W3C ``traceparent``).

    A role served as an A2A agent then answers under the span of the run that asked it: the A2A
    SDK's server spans join the caller's trace.
    """

    def __init__(self, app: Any) -> None:
        """Wrap ``app``."""
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Serve ``scope`` in the context its headers carry (as it is, without OpenTelemetry)."""
        try:
            from opentelemetry import context, propagate
        except ImportError:
            await self.app(scope, receive, send)
            return
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        carrier = {key.decode("latin-1"): value.decode("latin-1") for key, value in scope.get("headers", ())}
        token = context.attach(propagate.extract(carrier))
        try:
            await self.app(scope, receive, send)
        finally:
            context.detach(token)
