"""Layer 6, tool-calling agents (OpenManus shape): tools, the confined sandbox, agents, AgentRole on the bus."""
