"""The sentence-transformers stack: its folder read (modules, pooling, head, prompts, a
CrossEncoder's settings), the stack as one torch module, and the texts and weights behind it."""
