"""Runnable scenarios: each module exposes ``Config`` and ``build(config, llm) -> ScenarioPlan``.

Run one with ``metaroles run NAME``.
"""
