"""Layer 9, one Environment's roles on several shards, in lock-step.

In this process or on Ray actors: the driver, the shard, what they say to each other each round,
and how roles travel between them.
"""
