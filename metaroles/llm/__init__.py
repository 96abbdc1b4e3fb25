"""Layer 3, models: the narrow LLM protocol, offline doubles, providers, cassettes, cost ledger, limits."""
