"""Prompt templates of metaroles.agents, loaded with metaroles.core.prompts.load_prompt."""
