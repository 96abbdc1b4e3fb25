"""Prompt templates of metaroles.longterm, loaded with metaroles.core.prompts.load_prompt."""
