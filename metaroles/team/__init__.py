"""Layer 10, a Team runs a project.

Roles hired into an Environment, budgets, the rounds run through a runtime (this process or shards),
recorded as they go, resumed and forked from checkpoints.
"""

from typing import Any

__all__ = ["Team"]


def __getattr__(name: str) -> Any:
    """``from metaroles.team import Team`` (MetaGPT's ``metagpt.team``), imported when asked for."""
    if name == "Team":
        from metaroles.team.team import Team

        return Team
    raise AttributeError(f"module 'metaroles.team' has no attribute {name!r}")
