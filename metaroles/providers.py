"""Resolve a model by name: ``"test"``, ``"test:SEED"``, ``"scripted:PATH"``, or an LLM instance.

Provider SDKs are imported here, lazily, only when their name is asked for; importing
metaroles never imports one.
"""

from __future__ import annotations

from metaroles.cassette import CassetteLLM, CassetteMode
from metaroles.exceptions import ConfigError
from metaroles.llm import LLM
from metaroles.offline import ScriptedLLM, TestLLM

KNOWN_NAMES = ("test", "test:SEED", "scripted:PATH", "replay:PATH")


def resolve_llm(spec: str | LLM) -> LLM:
    """Return the model named by ``spec`` (an LLM instance is returned as is).

    Raises:
        ConfigError: On an unknown name, a bad seed, or a script file that does not parse.
    """
    if not isinstance(spec, str):
        if isinstance(spec, LLM):
            return spec
        raise ConfigError(f"llm={spec!r} is not a model; pass an LLM instance or one of {KNOWN_NAMES}")
    kind, _, arg = spec.partition(":")
    if kind == "test":
        if not arg:
            return TestLLM()
        try:
            return TestLLM(int(arg))
        except ValueError:
            raise ConfigError(f"llm={spec!r}: the seed after 'test:' must be an integer, e.g. 'test:7'") from None
    if kind == "replay":
        if not arg:
            raise ConfigError(f"llm={spec!r} needs a cassette: 'replay:path/to/cassette.jsonl'")
        return CassetteLLM(arg, mode=CassetteMode.REPLAY)
    if kind == "scripted":
        if not arg:
            raise ConfigError(f"llm={spec!r} needs a file: 'scripted:path/to/script.json'")
        return ScriptedLLM.from_file(arg)
    raise ConfigError(f"llm={spec!r} is not a known model; use an LLM instance or one of {KNOWN_NAMES}")
