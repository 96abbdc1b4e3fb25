"""Layer 7, runs as data.

The event log (written and read), checkpoints and their restore, the final state, a workspace kept
with each checkpoint, shards' checkpoint parts, and the export of a log as rows.
"""
