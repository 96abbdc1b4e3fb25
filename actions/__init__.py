"""Reusable concrete Actions; their prompts ship beside them in ``actions/prompts``."""

from metaroles.actions.debate import JudgeDebate, SpeakAloud, Verdict

__all__ = ["JudgeDebate", "SpeakAloud", "Verdict"]
