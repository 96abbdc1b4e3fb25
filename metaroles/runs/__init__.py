"""Layer 7, runs as data: Team, event log, checkpoints, restore, run directories, scenarios, diff."""
