"""Debate actions: speak for a side, and judge the exchange with a structured verdict."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field

from metaroles import Action, Message, UserRequirement
from metaroles.core.prompts import load_prompt, render_prompt

CONTEXT_TURNS = 8
QUOTED_WORDS = 12
"""The opponent's speech is quoted this far: a small model given all of it repeats it, side and all."""
SPEECH_TOKENS = 160
"""A speech's length at most (two or three sentences, and a margin)."""


def debate_topic(history: Sequence[Message]) -> str:
    """The motion: the content of the first user requirement in ``history``."""
    requirement = UserRequirement.action_id()
    return next((m.content or "" for m in history if m.cause_by == requirement), "(no motion given)")


def debate_context(history: Sequence[Message]) -> str:
    """The newest speeches, one per line."""
    speeches = [str(m) for m in history if m.cause_by == SpeakAloud.action_id()]
    return "\n".join(speeches[-CONTEXT_TURNS:]) or "(you open the debate)"


def last_speech(history: Sequence[Message], *, not_by: str) -> str | None:
    """The newest speech in ``history`` that ``not_by`` did not make (the opponent's), if any."""
    speech = SpeakAloud.action_id()
    return next((m.content or "" for m in reversed(history) if m.cause_by == speech and m.sent_from != not_by), None)


class SpeakAloud(Action):
    """One debater's turn."""

    desc = "Answer the opponent and make a new point."

    def __init__(self, *, side: str = "pro", **kwargs: object) -> None:
        """Speak for ``side`` ("pro" or "con")."""
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.side = side

    async def run(self, history: Sequence[Message]) -> str:
        """Ask for a speech: the motion and this side up front, then the opponent's last speech, if any.

        A small model (the embedded default) follows a prompt that names the motion and the side
        it argues in every message; given a transcript to continue, it asks what the topic is.
        """
        topic, last = debate_topic(history), last_speech(history, not_by=self.role_name)
        stance = "agree with" if self.side == "pro" else "disagree with"
        system = render_prompt(
            load_prompt("metaroles.actions.prompts", "speaker.txt"),
            name=self.role_name,
            stance_word="for" if self.side == "pro" else "against",
            topic=topic,
        )
        if last is None:
            prompt = render_prompt(
                load_prompt("metaroles.actions.prompts", "speak_open.txt"), topic=topic, stance=stance
            )
        else:
            prompt = render_prompt(
                load_prompt("metaroles.actions.prompts", "speak.txt"),
                topic=topic,
                stance=stance,
                last=" ".join(last.split()[:QUOTED_WORDS]),
                verdict="right" if self.side == "pro" else "wrong",
            )
        return await self.aask(prompt, system_msgs=[system], max_tokens=SPEECH_TOKENS)


class Verdict(BaseModel):
    """The judge's decision."""

    winner: Literal["pro", "con"]
    """The side that argued better."""
    reasoning: str = Field(min_length=20, max_length=200)
    """Why, in a sentence or two."""
    confidence: float = Field(ge=0.0, le=1.0)
    """How sure the judge is."""


class JudgeDebate(Action):
    """Decide the debate; the verdict is the message's ``instruct_content``."""

    desc = "Judge the debate."
    output_model = Verdict

    async def run(self, history: Sequence[Message]) -> Verdict:
        """Render the judging prompt and ask for a :class:`Verdict`."""
        prompt = render_prompt(
            load_prompt("metaroles.actions.prompts", "judge.txt"),
            topic=debate_topic(history),
            context=debate_context(history),
        )
        return await self.aask(prompt, output_model=Verdict)
