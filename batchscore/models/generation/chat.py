"""Chat templates: each row's prompt as the user turn of the model's own chat template.

An instruction-tuned model answers the turns it was trained on, wrapped in its special tokens;
fed bare text it continues it as a document, which reads as gibberish. `[generate].chat` renders
each row as transformers' ``apply_chat_template(messages, add_generation_prompt=True)`` does
(the template is the model folder's, rendered by transformers' own sandboxed renderer) and
tokenizes the result as it does: with no special tokens added, since the template writes them.
The user turn is the row's prompt (`[generate].prompt` over its columns, or its text), after an
optional `[generate].system` message; with `[generate].messages` the row's text is the whole
conversation instead, a JSON list of ``{role, content}`` (as OpenAI's chat requests carry it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from batchscore.errors import ModelError
from batchscore.models.text.text import TextEncoder, Tokens
from batchscore.work.units import Encoded

# Where transformers' tokenizer finds a folder's templates: the default one in its own file, or
# named ones in a folder beside it, or (as most hub folders ship them) in tokenizer_config.json
TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_DIR = "additional_chat_templates"
PROBE = "Hello."


def has_chat_template(path: Path) -> bool:
    """Whether a model folder ships a default chat template, read from its files alone (what
    `validate` checks; loading the tokenizer finds the same one)."""
    if (path / TEMPLATE_FILE).is_file():
        return True
    named = path / TEMPLATE_DIR
    if named.is_dir() and any(named.glob("*.jinja")):  # these files replace the config's
        return (named / "default.jinja").is_file()
    try:
        settings = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    template = settings.get("chat_template") if isinstance(settings, dict) else None
    if isinstance(template, list):  # named templates: transformers uses the one named default
        return any(isinstance(t, dict) and t.get("name") == "default" for t in template)
    return isinstance(template, str) and bool(template.strip())


def read_messages(text: str) -> list[dict[str, str]]:
    """A row's conversation from its JSON text; a row that is not one is refused (ValueError),
    alone, as a row the template refuses."""
    found = json.loads(text)
    if not isinstance(found, list) or not found:
        raise ValueError("expected a non-empty JSON list of messages")
    for message in found:
        if not isinstance(message, dict) or not {"role", "content"} <= set(message):
            raise ValueError(f"expected messages with a role and a content, got {message!r}")
    return found


def no_template(source: Path) -> ModelError:
    """What `validate` and loading say of a model without a chat template, when asked for chat."""
    return ModelError(
        f"[generate].chat: {source} has no chat template (in tokenizer_config.json or "
        f"{TEMPLATE_FILE}); set chat = false and write the model's prompt format in "
        "[generate].prompt"
    )


class Chat:
    """Renders rows' prompts through a transformers tokenizer's chat template."""

    def __init__(
        self, tokenizer: Any, system: str | None, source: Path, *, messages: bool = False
    ) -> None:
        try:
            template = tokenizer.get_chat_template()
        except ValueError:
            template = ""
        if not template.strip():  # none, or an empty one: every prompt would be empty
            raise no_template(source)
        self.tokenizer = tokenizer
        self.system = system
        self.messages = False  # the probe is one user turn, whatever the rows hold
        try:
            self.apply([PROBE])
        except Exception as exc:  # the template's own raise_exception, or a Jinja error
            raise self.refusal(exc, source) from exc
        self.messages = messages

    def refusal(self, exc: Exception, source: Path) -> ModelError:
        """Why the probe conversation does not render, blaming the system message only when
        the template takes the user turn alone (a broken template is the template's fault)."""
        if self.system is not None:
            try:
                Chat(self.tokenizer, None, source)
            except ModelError as alone:
                return alone
            return ModelError(
                f"[generate].system: {source}'s chat template refuses a system message then "
                f"one user turn: {exc}"
            )
        return ModelError(f"[generate].chat: {source}'s chat template refuses one user turn: {exc}")

    def conversation(self, text: str) -> list[dict[str, str]]:
        """The messages of one row: the system message, if any, then the row's prompt."""
        system = [{"role": "system", "content": self.system}] if self.system is not None else []
        if self.messages:
            return [*system, *read_messages(text)]
        return [*system, {"role": "user", "content": text}]

    def apply(self, texts: list[str]) -> list[str]:
        """The rendered prompts (transformers' ``apply_chat_template``, not tokenized)."""
        conversations = [self.conversation(t) for t in texts]
        return self.tokenizer.apply_chat_template(
            conversations, add_generation_prompt=True, tokenize=False
        )

    def render(self, texts: list[str]) -> tuple[list[str | None], dict[int, str]]:
        """Each text rendered, in one call; where the template refuses a row (its own
        ``raise_exception``), None and why, by position in ``texts``."""
        try:
            return list(self.apply(texts)), {}
        except Exception:  # find the rows it refuses, one at a time
            rendered: list[str | None] = []
            errors: dict[int, str] = {}
            for i, text in enumerate(texts):
                try:
                    rendered.append(self.apply([text])[0])
                except Exception as exc:
                    rendered.append(None)
                    errors[i] = f"[generate].chat: the model's chat template refuses it: {exc}"
            return rendered, errors

    def encode(
        self, encoder: TextEncoder, texts: list[str], rows: np.ndarray, errors: dict[int, str]
    ) -> Encoded:
        """An `Encoded` window of the rows' rendered prompts, tokenized with no special tokens
        added (the template wrote them), cut at `max_length` as the encoder cuts prompts."""
        rendered, refused = self.render(texts)
        kept = [i for i in range(len(texts)) if i not in refused]
        errors = {**errors, **{int(rows[i]): message for i, message in refused.items()}}
        ids, truncated = encoder.encode([rendered[i] for i in kept], add_special_tokens=False)
        tokens = Tokens(ids, np.arange(len(ids)), truncated)
        return tokens.encoded(rows[np.asarray(kept, dtype=np.int64)], errors)
