"""Layer 1, the vocabulary: exceptions, validated value types, run-derived ids, durable writes, prompt files.

Imports nothing else of metaroles.
"""
