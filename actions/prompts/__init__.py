"""Prompt files of the reusable actions (package data)."""
