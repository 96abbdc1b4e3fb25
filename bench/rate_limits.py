"""A tokens-per-minute limit that holds: refusals and the share of the allowed tokens used, minute by minute.

A Chat Completions server on 127.0.0.1 (``tests/limited_server.py``) admits at most ``--limit``
tokens in any sliding minute, charging each call its prompt and its ``max_tokens`` when it admits
it, and refuses the rest with 429 and ``retry-after-ms``; it sends ``x-ratelimit-*`` headers to the
paced client only (from them alone a client now paces itself: the unpaced one hears nothing).
``--callers`` callers ask it without a pause for ``--minutes`` minutes through ``--llm openai``'s
client: once paced (``LimitedLLM(tokens_per_minute=LIMIT)``: ``--tokens-per-minute`` on the command
line) and once not (the adaptive in-flight limit and the server's ``Retry-After`` alone). Per
minute: ``refused`` (429s) and ``used`` (the admitted tokens over the limit). Goal: no 429 after
the first minute, ``used`` ≥ 0.9.

Run: ``python bench/rate_limits.py`` (about 2 × ``--minutes`` minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metaroles import LLMRequest
from metaroles.llm.limits import MINUTE, LimitedLLM
from metaroles.llm.openai_compat import OpenAICompatibleLLM
from tests.limited_server import LimitedServer


async def load(limit: int, minutes: float, callers: int, paced: bool) -> dict[str, list[float]]:
    """Ask without a pause for ``minutes``; refusals and the share of the limit used, per minute."""
    server = LimitedServer(limit, MINUTE, headers=paced)  # unpaced: nothing tells the client the limit
    try:
        inner = OpenAICompatibleLLM("m", base_url=server.url, max_tokens=200, max_retries=1000, backoff=0.05)
        llm = LimitedLLM(inner, max_in_flight=16, tokens_per_minute=limit if paced else None, adaptive=True)
        start = anyio.current_time()
        deadline = start + minutes * MINUTE

        async def caller(number: int) -> None:
            asked = 0
            while anyio.current_time() < deadline:
                asked += 1
                text = f"caller {number}, question {asked}: " + "tell me about the weather " * 40
                await llm.complete(LLMRequest(messages=[{"role": "user", "content": text}]))

        with anyio.move_on_after(minutes * MINUTE + 5):
            async with anyio.create_task_group() as group:
                for number in range(callers):
                    group.start_soon(caller, number)
        first = server.admitted[0][0] if server.admitted else 0.0
        spans = range(int(minutes))
        return {
            "refused": [sum(1 for at, _ in server.refused if first + k * MINUTE <= at < first + (k + 1) * MINUTE)
                        for k in spans],
            "used": [round(sum(n for at, n in server.admitted if first + k * MINUTE <= at < first + (k + 1) * MINUTE)
                           / limit, 3) for k in spans],
        }  # fmt: skip
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=20_000, help="tokens per minute the server allows")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--callers", type=int, default=32)
    args = parser.parse_args()
    figures: dict[str, object] = {"load_before": round(os.getloadavg()[0], 2), "limit": args.limit}
    for paced in (True, False):
        figures["paced" if paced else "unpaced"] = anyio.run(load, args.limit, args.minutes, args.callers, paced)
    figures["load_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
