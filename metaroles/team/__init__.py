"""Layer 10, a Team runs a project.

Roles hired into an Environment, budgets, the rounds run through a runtime (this process or shards),
recorded as they go, resumed and forked from checkpoints.
"""
