"""What the Ray tests ship to shard actors (pickled by value: a worker need not import the tests)."""

from __future__ import annotations

import gc
import json
import os
import signal
from collections.abc import Sequence

from metaroles import Action, Message, Role
from metaroles.llm.offline import TestLLM
from metaroles.llm.protocol import LLMRequest, LLMResponse


class KillerLLM(TestLLM):
    """The test model, but the ``call``-th request of role ``victim`` kills the process it runs in (mid-turn)."""

    def __init__(self, victim: str, call: int) -> None:
        super().__init__()
        self.victim = victim
        self.call = call
        self.seen = 0

    async def complete(self, request: LLMRequest) -> LLMResponse:
        if request.role == self.victim:
            self.seen += 1
            if self.seen == self.call:
                os.kill(os.getpid(), signal.SIGKILL)
        return await super().complete(request)


class Thresholds(Action):
    """Says the collector's thresholds in the process the turn runs in, and the process."""

    async def run(self, history: Sequence[Message]) -> str:
        return json.dumps({"pid": os.getpid(), "thresholds": gc.get_threshold()})


class Renumbered:
    """A cast's recipe that names each role by how many it has made: a shard's copy makes other names."""

    def __init__(self) -> None:
        self.made = 0

    def __call__(self, i: int) -> Role:
        self.made += 1
        return Role(name=f"n{self.made}")
