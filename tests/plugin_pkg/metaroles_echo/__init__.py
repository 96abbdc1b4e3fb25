"""A tiny plug-in: an Echo role and a scenario that uses it."""
