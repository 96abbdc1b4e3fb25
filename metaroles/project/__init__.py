"""Layer 11, scenarios as runnable projects.

The registry, run directories, sweeps, evaluation suites and their scoring, tables, rubrics and
training exports.
"""
