"""Layer 4, memory that outlives a turn: embeddings, Faiss storage, LongtermMemory, BrainMemory, stores."""
