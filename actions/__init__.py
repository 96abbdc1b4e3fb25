"""Reusable concrete Actions; their prompts ship beside them in ``actions/prompts``."""

from actions.debate import JudgeDebate, SpeakAloud, Verdict

__all__ = ["JudgeDebate", "SpeakAloud", "Verdict"]
