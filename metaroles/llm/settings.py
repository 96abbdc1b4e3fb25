"""Model settings: one value, built at the entry point from the environment or the command line.

Nothing in metaroles reads environment variables except :meth:`LLMSettings.from_env`, which the
command line calls once. Everything else receives the settings (or the model) as an argument.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, Field

ENV_LLM = "METAROLES_LLM"
ENV_BASE_URL = "OPENAI_BASE_URL"
ENV_API_KEY = "OPENAI_API_KEY"
ENV_MODEL = "METAROLES_MODEL"
ENV_TUNING = {
    "temperature": "METAROLES_TEMPERATURE",
    "timeout": "METAROLES_TIMEOUT",
    "requests_per_second": "METAROLES_RATE_LIMIT",
    "max_in_flight": "METAROLES_MAX_IN_FLIGHT",
    "tokens_per_minute": "METAROLES_TOKENS_PER_MINUTE",
    "requests_per_minute": "METAROLES_REQUESTS_PER_MINUTE",
}
"""Settings the environment may give besides the model (``--temperature``, ``--timeout``, ``--rate-limit``,
``--max-in-flight``, ``--tokens-per-minute``, ``--requests-per-minute`` on the command line win over them)."""


class LLMSettings(BaseModel):
    """How to reach a language model.

    ``llm="auto"`` resolves to: an OpenAI-compatible server when ``base_url`` or ``api_key`` is
    set → the embedded local model when it is installed → ``TestLLM`` (with a notice).
    """

    llm: str = "auto"
    """``auto``, ``openai``, ``local``, ``test``, ``test:SEED`` or ``scripted:PATH``."""
    base_url: str | None = Field(default=None, repr=False)
    """OpenAI-compatible endpoint, e.g. ``http://127.0.0.1:8080/v1`` (vLLM, Ollama, llama.cpp)."""
    api_key: str | None = Field(default=None, repr=False)
    """Key for the endpoint; local servers accept any (never shown in a repr)."""
    model: str | None = None
    """Model name sent to the server (or the local model's name)."""
    temperature: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    timeout: float = Field(default=60.0, gt=0)
    """Seconds before a call times out (it is then retried)."""
    max_retries: int = Field(default=3, ge=0)
    """Retries on 429, 5xx, timeouts and connection errors, with exponential backoff and jitter."""
    max_in_flight: int | None = Field(default=None, ge=1)
    """Calls to this model in flight at most; ``None``: a server's is learnt up to 64, the local model batches 8."""
    requests_per_second: float | None = Field(default=None, gt=0)
    """Optional rate limit."""
    tokens_per_minute: float | None = Field(default=None, gt=0)
    """Optional limit of tokens (prompt and answer) per minute: calls are paced to stay within it."""
    requests_per_minute: float | None = Field(default=None, gt=0)
    """Optional limit of calls per minute, over a sliding minute (a server's headers may set it too)."""
    batch: bool = False
    """Send the calls that come together (a round's) as one batch of the server's Batch API (``llm.batching``)."""
    batch_deadline: float = Field(default=86_400.0, gt=0)
    """Seconds a batch may take before the run stops (resumable: the batch stays pending)."""
    batch_journal: str | None = Field(default=None, repr=False)
    """Where pending batches are kept (a run directory's ``batches.json``): a resumed run waits for them."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: object) -> LLMSettings:
        """Read ``METAROLES_LLM``, ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``METAROLES_MODEL`` and :data:`ENV_TUNING`.

        Explicit ``overrides`` (command-line options) win over the environment.
        """
        values: dict[str, object] = {
            "llm": environ.get(ENV_LLM) or "auto",
            "base_url": environ.get(ENV_BASE_URL) or None,
            "api_key": environ.get(ENV_API_KEY) or None,
            "model": environ.get(ENV_MODEL) or None,
            **{field: environ[name] for field, name in ENV_TUNING.items() if environ.get(name)},
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)
