"""Prompt templates of metaroles.bus, loaded with metaroles.core.prompts.load_prompt."""
