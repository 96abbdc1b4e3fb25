"""An OpenAI-compatible chat model (OpenAI, vLLM, Ollama, llama.cpp's server, LM Studio).

Built on the ``openai`` SDK's async client. This module imports ``openai``; metaroles imports
this module only when such a model is asked for (``resolve_llm``), never at ``import metaroles``.

Retries: 429, 5xx, timeouts and connection errors are retried after the wait a server asks for
(``Retry-After``, ``retry-after-ms``), else with exponential backoff and full jitter, at most
``max_retries`` times; then :class:`~metaroles.core.exceptions.ProviderError`. (Our retries rather
than the SDK's: they also cover a stream cut before its end and the call's total deadline.)
"""

from __future__ import annotations

import email.utils
import inspect
import json
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import openai

from metaroles.core.exceptions import EndpointBusy, EndpointUnreachable, ProviderError
from metaroles.core.schema import Function, ToolCall
from metaroles.core.text import redacted
from metaroles.llm.protocol import LLMRequest, LLMResponse, Usage

TokenCallback = Callable[[str], "Awaitable[None] | None"]
"""Called with each piece of text as it streams in."""


class _StreamCut(Exception):
    """A streamed answer ended before its final event (the connection dropped mid-answer)."""


class _Malformed(Exception):
    """The server answered with something that is not a chat completion (no choices, wrong types, not JSON)."""


_RETRYABLE = (
    openai.RateLimitError,
    openai.InternalServerError,
    openai.APITimeoutError,
    openai.APIConnectionError,
    TimeoutError,  # the call's total deadline passed (a server trickling bytes resets every read timeout)
    _StreamCut,
    _Malformed,  # a proxy's error page, a body cut short: the next try may be whole
)


def _tool_choice(choice: str | None) -> Any:
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def _request_kwargs(request: LLMRequest, defaults: dict[str, Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"messages": request.messages, **defaults}
    for field in ("temperature", "max_tokens", "seed"):
        value = getattr(request, field)
        if value is not None:
            kwargs[field] = value
    if request.tools:
        kwargs["tools"] = request.tools
    if request.tool_choice is not None:
        kwargs["tool_choice"] = _tool_choice(request.tool_choice)
    if request.output_schema is not None:
        schema = {"name": "output", "schema": request.output_schema}
        kwargs["response_format"] = {"type": "json_schema", "json_schema": schema}
    return kwargs


def _tool_calls(raw: Any) -> list[ToolCall] | None:
    if not raw:
        return None
    return [ToolCall(id=c.id, function=Function(name=c.function.name, arguments=c.function.arguments)) for c in raw]


class OpenAICompatibleLLM:
    """A chat model behind an OpenAI-compatible HTTP API.

    Args:
        model: Model name sent with each request.
        base_url: The API's base URL (``.../v1``); the SDK's default when ``None``.
        api_key: The key; local servers accept any non-empty string.
        temperature: Default sampling temperature.
        max_tokens: Default bound on answer length.
        seed: Default sampling seed.
        timeout: Seconds a call may take in all (connect, and every read of a streamed answer), and
            the SDK's per-read timeout; a call past it is retried like any timeout.
        max_retries: Retries on 429, 5xx, timeouts and connection errors.
        backoff: Base delay in seconds of the exponential backoff (0 retries at once).
        sleep: How to wait between attempts (``anyio.sleep``); a server's ``Retry-After`` sets how long.
        on_token: Stream answers and call this with each piece of text.
        body_timeout: Seconds an answer's body may take once its headers came (the model has answered by
            then: a body that stalls is cut short, and the call is retried without waiting out ``timeout``).

    ``on_backoff``, when set (an adaptive :class:`~metaroles.llm.limits.LimitedLLM` sets it), is told
    the wait before a retry the server asked for by refusing for load (429, 503, or a ``Retry-After``).
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        seed: int | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        on_token: TokenCallback | None = None,
        sleep: Callable[[float], Awaitable[object]] = anyio.sleep,
        body_timeout: float = 10.0,
    ) -> None:
        """Create the client; no request is sent until the first call."""
        self._args: dict[str, Any] = {
            "base_url": base_url,
            "api_key": api_key,
            "temperature": temperature,
            "max_tokens": max_tokens,
            "seed": seed,
            "timeout": timeout,
            "max_retries": max_retries,
            "backoff": backoff,
            "on_token": on_token,
            "sleep": sleep,
            "body_timeout": body_timeout,
        }
        self.model = model
        self.max_retries = max_retries
        self.max_tokens = max_tokens
        """The answer's length when a request sets none (a tokens-per-minute limit counts it)."""
        self.backoff = backoff
        self.timeout = timeout
        self.body_timeout = body_timeout
        self.on_token = on_token
        self._sleep = sleep
        self._defaults: dict[str, Any] = {"model": model}
        for name, value in (("temperature", temperature), ("max_tokens", max_tokens), ("seed", seed)):
            if value is not None:
                self._defaults[name] = value
        self._client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key or "not-needed", timeout=timeout, max_retries=0
        )
        self._jitter = random.Random()
        self.on_backoff: Callable[[float], object] | None = None
        self.on_limits: Callable[[float | None, float | None, str], object] | None = None
        """Told the tokens or requests per minute limit and what remains of it (``x-ratelimit-*``), and which."""

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as the arguments it was made with (a shard makes its own HTTP client from them)."""
        return _rebuilt, (self.model, self._args)

    def _delay(self, attempt: int, exc: BaseException | None = None) -> float:
        """How long to wait before the next attempt: what the server asked for, else full jitter.

        A 429 or 503 with ``Retry-After`` (seconds or an HTTP date) or ``retry-after-ms`` is
        honoured, up to 60 s, as the ``openai`` SDK's own retries do; otherwise uniform in
        [0, backoff * 2**attempt], capped at 30 s.
        """
        asked = _retry_after(getattr(getattr(exc, "response", None), "headers", None))
        if asked is not None:
            return asked
        return self._jitter.uniform(0, min(30.0, self.backoff * 2**attempt))

    async def aclose(self) -> None:
        """Close the HTTP client's connections (on the event loop that used them)."""
        await self._client.close()

    def request_body(self, request: LLMRequest) -> dict[str, Any]:
        """The Chat Completions arguments this client sends for ``request`` (model, messages, sampling, format)."""
        return _request_kwargs(request, self._defaults)

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Send ``request``, retrying transient failures.

        Raises:
            ProviderError: After the retries, or at once on a non-transient error (4xx).
        """
        kwargs = self.request_body(request)
        for attempt in range(self.max_retries + 1):
            try:
                with anyio.fail_after(self.timeout):
                    if self.on_token is not None:
                        return await self._stream(kwargs)
                    try:
                        return self._response(await self._answer(kwargs))
                    except (json.JSONDecodeError, AttributeError, IndexError, KeyError, TypeError) as exc:
                        raise _Malformed(f"the answer is not a chat completion ({type(exc).__name__}: {exc})") from exc
            except _RETRYABLE as exc:
                if attempt == self.max_retries:
                    said = (
                        f"{self.model!r} failed {attempt + 1} time(s) for role {request.role!r}, action "
                        f"{request.action!r}: {exc}; check the server or raise max_retries/timeout"
                    )
                    if type(exc) is openai.APIConnectionError:  # not its subclass, a timeout
                        raise EndpointUnreachable(said) from exc
                    asked = _retry_after(getattr(getattr(exc, "response", None), "headers", None))
                    raise EndpointBusy(said, retry_after=asked) from exc
                delay = self._delay(attempt, exc)
                if self.on_backoff is not None and _overloaded(exc):
                    self.on_backoff(delay)
                await self._sleep(delay)
            except openai.APIError as exc:
                raise ProviderError(
                    f"{self.model!r} refused the request of role {request.role!r}, action {request.action!r}: {exc}"
                ) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def _answer(self, kwargs: dict[str, Any]) -> Any:
        """The completion, its body read within ``body_timeout`` of its headers (a body cut short fails fast)."""
        async with self._client.chat.completions.with_streaming_response.create(**kwargs) as raw:
            if self.on_limits is not None:
                for kind in ("tokens", "requests"):
                    limit, remaining = (
                        _number(raw.headers.get(f"x-ratelimit-{k}-{kind}")) for k in ("limit", "remaining")
                    )
                    if limit is not None or remaining is not None:
                        self.on_limits(limit, remaining, kind)
            try:
                with anyio.fail_after(self.body_timeout):
                    await raw.read()
            except TimeoutError:
                raise _StreamCut(f"the answer's body stalled {self.body_timeout:g}s after its headers") from None
            return await raw.parse()

    @property
    def client(self) -> openai.AsyncOpenAI:
        """The SDK's client (a batch of calls uses its files and batches: ``llm.batching``)."""
        return self._client

    def answer_of(self, body: dict[str, Any]) -> LLMResponse:
        """A Chat Completions body (a batch's answer line) as this client's answer.

        Raises:
            ProviderError: When ``body`` is not a chat completion.
        """
        from openai.types.chat import ChatCompletion

        try:
            return self._response(ChatCompletion.model_validate(body))
        except (ValueError, AttributeError, IndexError, KeyError, TypeError) as exc:
            raise ProviderError(f"{self.model!r}: a batch's answer is not a chat completion ({exc})") from None

    def _response(self, completion: Any) -> LLMResponse:
        if not completion.choices:
            raise IndexError("it has no choices")
        choice = completion.choices[0].message
        if not isinstance(choice.content, str | None):
            raise TypeError(f"its content is {type(choice.content).__name__}, not text")
        usage = completion.usage
        return LLMResponse(
            text=choice.content or "",
            tool_calls=_tool_calls(choice.tool_calls),
            usage=_usage(usage),
            model=completion.model or self.model,
        )

    async def _stream(self, kwargs: dict[str, Any]) -> LLMResponse:
        stream = await self._client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
        text: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        usage, model, finished = Usage(), self.model, False
        async for chunk in stream:
            model = chunk.model or model
            if chunk.usage is not None:
                usage = _usage(chunk.usage)
            for choice in chunk.choices:
                finished = finished or choice.finish_reason is not None
                await self._take_delta(choice.delta, text, calls)
        if not finished:
            raise _StreamCut(f"the streamed answer stopped after {len(''.join(text))} characters, before its end")
        tool_calls = [
            ToolCall(id=c["id"], function=Function(name=c["name"], arguments=c["arguments"])) for c in calls.values()
        ]
        return LLMResponse(text="".join(text), tool_calls=tool_calls or None, usage=usage, model=model)

    async def _take_delta(self, delta: Any, text: list[str], calls: dict[int, dict[str, str]]) -> None:
        if delta.content:
            text.append(delta.content)
            if self.on_token is not None:
                result = self.on_token(delta.content)
                if inspect.isawaitable(result):
                    await result
        for call in delta.tool_calls or ():
            entry = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
            entry["id"] = call.id or entry["id"]
            if call.function is not None:
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""

    def __repr__(self) -> str:
        """Show the model and the endpoint."""
        return f"OpenAICompatibleLLM(model={self.model!r}, base_url={redacted(self.base_url)!r})"

    @property
    def base_url(self) -> str:
        """The endpoint's base URL, as the SDK uses it (without a trailing slash)."""
        return str(self._client.base_url).rstrip("/")


def _number(text: str | None) -> float | None:
    """A header's number, if it is one."""
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _retry_after(headers: Any) -> float | None:
    """Seconds a response's ``retry-after-ms`` or ``Retry-After`` header asks to wait (0–60), if any."""
    if headers is None:
        return None
    try:
        if headers.get("retry-after-ms"):
            seconds = float(headers["retry-after-ms"]) / 1000
        elif headers.get("retry-after"):
            text = headers["retry-after"]
            try:
                seconds = float(text)
            except ValueError:
                seconds = email.utils.parsedate_to_datetime(text).timestamp() - time.time()
        else:
            return None
    except (TypeError, ValueError, OverflowError):
        return None
    return seconds if 0 <= seconds <= 60 else None


def _rebuilt(model: str, args: dict[str, Any]) -> OpenAICompatibleLLM:
    """An :class:`OpenAICompatibleLLM` made anew from the arguments of one pickled elsewhere."""
    return OpenAICompatibleLLM(model, **args)


def _overloaded(exc: BaseException) -> bool:
    """Whether the server refused for load: 429, 503, or any refusal saying when to come back."""
    response = getattr(exc, "response", None)
    if response is None:
        return False
    return response.status_code in (429, 503) or _retry_after(response.headers) is not None


def _usage(usage: Any) -> Usage:
    """The tokens an answer reports, with the prompt tokens its server took from its cache."""
    if usage is None:
        return Usage()
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) or 0
    return Usage(
        prompt_tokens=usage.prompt_tokens or 0, completion_tokens=usage.completion_tokens or 0, cached_tokens=cached
    )
