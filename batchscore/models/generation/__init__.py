"""Generation's machinery: the chat template, decoding as transformers' generate decodes, stop
strings, and continuous batching (the schedule and the KV-cache seats it moves rows through)."""
