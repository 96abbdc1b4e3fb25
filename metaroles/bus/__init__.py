"""Layer 5, the bus: Action, Role (observe, think, act), Environment (routing, rounds) and saved state."""
