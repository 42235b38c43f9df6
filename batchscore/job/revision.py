"""`[model].revision`: a branch, a tag or a commit hash, by git's own rules for ref names.

The revision becomes a file name under the Hugging Face cache's ``refs/`` folder, so anything a
ref name may not hold (an absolute path, a ``..``, a backslash, a control character) would let a
job file read a file from anywhere on the machine. Only what ``git check-ref-format
--allow-onelevel`` accepts is a revision; the rest is a job error naming the key.
"""

from __future__ import annotations

import re

# characters git never allows in a ref name: ASCII controls, DEL, space and ~^:?*[\
FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")
MAX_PART_BYTES = 255  # a ref is a file name per part: longer than any file system allows


def revision_problem(revision: str) -> str | None:
    """Why ``revision`` is not a branch, tag or commit name, or None when it is one."""
    if not revision:
        return "is empty"
    if bad := FORBIDDEN.search(revision):
        return f"may not hold {bad.group()!r}"
    if revision.startswith("-"):
        return "may not start with - (it would read as an option)"
    if revision.startswith("/") or revision.endswith("/") or "//" in revision:
        return "is a path; a branch or tag name neither starts nor ends with /, nor holds //"
    if ".." in revision or "@{" in revision or revision == "@":
        return "may not hold .. or @{, nor be @"
    if revision.endswith("."):
        return "may not end with ."
    for part in revision.split("/"):
        if part.startswith(".") or part.endswith(".lock"):
            return f"{part!r}: no part of a ref name starts with . or ends with .lock"
        try:
            size = len(part.encode("utf-8"))
        except UnicodeEncodeError:
            return "is not valid text"
        if size > MAX_PART_BYTES:
            return f"has a part of {size} bytes; at most {MAX_PART_BYTES}"
    return None
