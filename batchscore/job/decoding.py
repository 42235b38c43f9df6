"""The checks that span a `[generate]` section's keys, which no one key's bounds can state:
the stop strings' count and length, the chat keys that need `chat = true`, and the structure
keys (`batchscore.job.structured`). `GenerateConfig.problems` gives them to the job's loader.
"""

from __future__ import annotations

from typing import Any

from batchscore.job.structured import structure_problems

MAX_STOP_STRINGS = 16  # [generate].stop: each is matched to the vocabulary when the model loads
MAX_STOP_CHARS = 256  # characters of one stop string: each step looks back over as many tokens


def decoding_problems(options: Any) -> list[str]:
    """What is wrong with a `[generate]` section's keys together (each message starts with its
    key). Whether a grammar is satisfiable is the model's check: it needs the engine."""
    found = structure_problems(options)
    if options.system is not None and not options.chat:
        found.append("system: a system message is a turn of the chat template; set chat = true")
    if options.messages and not options.chat:
        found.append("messages: each row's messages go through the chat template; set chat = true")
    if len(options.stop) > MAX_STOP_STRINGS:
        found.append(f"stop: at most {MAX_STOP_STRINGS} strings, got {len(options.stop)}")
    for text in options.stop:
        if not text:
            found.append("stop: an empty string would end every row before its first token")
        elif len(text) > MAX_STOP_CHARS:
            found.append(
                f"stop: {text[:20]!r}... is {len(text)} characters long; at most {MAX_STOP_CHARS}"
            )
    return found
