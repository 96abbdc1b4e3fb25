"""Two pydantic-ai agents talk through an OpenAI-compatible base URL; prints what each said (JSON).

``python pydantic_ai_chat.py BASE_URL`` talks through BASE_URL (a recording proxy, say);
``python pydantic_ai_chat.py --replay CASSETTE`` starts a replaying proxy of CASSETTE in this process and
talks through it (run with no network at all: nothing but the cassette answers).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

SETTINGS = {"max_tokens": 24, "temperature": 0.0}


def chat(base_url: str, turns: int = 3) -> list[list[str]]:
    """A host asks, a guest answers, ``turns`` times; each agent keeps its own side of the talk."""
    model = OpenAIChatModel("any", provider=OpenAIProvider(base_url=base_url, api_key="not-a-real-key"))
    host = Agent(model, instructions="You are a talk-show host. Ask one short question.", model_settings=SETTINGS)
    guest = Agent(
        model, instructions="You are a guest on a talk show. Answer in one sentence.", model_settings=SETTINGS
    )
    said: list[list[str]] = []
    heard, host_history, guest_history = "Welcome your guest, a baker.", None, None
    for _ in range(turns):
        asked = host.run_sync(heard, message_history=host_history)
        host_history = asked.all_messages()
        answered = guest.run_sync(asked.output, message_history=guest_history)
        guest_history = answered.all_messages()
        said += [["host", asked.output], ["guest", answered.output]]
        heard = answered.output
    return said


if __name__ == "__main__":
    if sys.argv[1] == "--replay":
        from metaroles.llm.proxy import ExchangeCassette, ProxyServer

        missed: list[str] = []
        with ProxyServer(ExchangeCassette(Path(sys.argv[2]), record=False), on_miss=missed.append).running() as proxy:
            print(json.dumps({"said": chat(proxy.url), "missed": missed}))
    else:
        print(json.dumps({"said": chat(sys.argv[1]), "missed": []}))
