"""How an encoder stack reads texts, without its weights (`StackText`): embed's encoding and
extractive summarize's read texts through it, and `Embedder` puts the weights behind it.
"""

from __future__ import annotations

from pathlib import Path

from batchscore.errors import ModelError
from batchscore.job.sections import ModelConfig
from batchscore.models.stack.stack import read_stack
from batchscore.models.text.text import TextEncoder, Tokens
from batchscore.models.text.windows import overlap


class StackText:
    """How an encoder stack reads texts, without its weights: the Transformer's tokenizer
    (lowercasing first when the stack says so), the prompt put before every text, and with
    `[model].long_text = "chunk"` a long text's windows, each led by the prompt."""

    def __init__(self, path: Path, model: ModelConfig, *, prompt_name: str | None = None) -> None:
        self.stack = read_stack(path)
        self.prompt = self.stack.prompt(prompt_name)
        self.encoder = TextEncoder(
            self.stack.encoder,
            model.max_length,
            model.trust_remote_code,
            lowercase=self.stack.lowercase,
        )
        self.chunk = model.long_text == "chunk"
        self.head, counted = self.encoder.prompt_tokens(self.prompt) if self.prompt else (0, 0)
        self.skip = 0 if self.stack.include_prompt else counted  # prompt tokens left out of pooling
        window = self.encoder.max_length - self.encoder.single.specials if self.chunk else 0
        if self.chunk and self.head >= window - overlap(self.encoder.max_length):
            raise ModelError(
                f'{path}: its prompt "{self.prompt}" leaves no room in a window of '
                f"{self.encoder.max_length} tokens; raise [model].max_length"
            )

    def tokens(self, texts: list[str]) -> Tokens:
        """The texts' units, the prompt put before each: one per text, or a long text's windows."""
        if self.prompt:
            texts = [self.prompt + text for text in texts]
        return self.encoder.tokens(texts, chunk=self.chunk, head=self.head)
