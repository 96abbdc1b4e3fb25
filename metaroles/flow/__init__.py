"""Layer 12, the message-flow graph of a run: networkx graphs, pictures, the interactive page."""
