"""Layer 2, what moves on the bus and what roles remember: Message, MessageQueue, Memory."""
