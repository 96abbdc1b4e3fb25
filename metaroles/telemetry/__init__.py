"""Layer 8, watching a run from outside.

OpenTelemetry traces and metrics of rounds, turns, model calls and messages (read from the round
record), and their export.
"""
