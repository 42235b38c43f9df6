"""A Hugging Face model put in the local cache: the one place batchscore uses the network.

`batchscore fetch` calls `download`; runs stay offline and find what it put there through
`hub.snapshot`. huggingface_hub's own ``snapshot_download`` does the work, into the standard
cache (content-addressed blobs, ``snapshots/<commit>/``, ``refs/<branch or tag>``) that
transformers, sentence-transformers and `hub.snapshot` read, and only the files batchscore
reads (`hub.read_patterns`): a repository's pickle weights (unless asked), ONNX or OpenVINO
exports and README never come down. A download cut off is taken up again by the next fetch
(huggingface_hub keeps what arrived), and until then `hub.snapshot` knows it incomplete.

What can go wrong becomes the package's errors, said once: a name or revision the hub does
not have, a gated or private repository, or the network forbidden by ``HF_HUB_OFFLINE``, is
the model's (exit 4); the hub out of reach (no route, refused, timed out) or answering 5xx or
429 is transient (exit 7: a scheduler retries); the cache's disk full or read-only is a write
error (exit 6).
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from batchscore.errors import ModelError, TransientIOError, write_error
from batchscore.models.source.hub import read_patterns, repo_folder

HUB = "the Hugging Face hub"
TRANSIENT_STATUS = 429  # too many requests: the hub's own "later"; and every 5xx
DISK = (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS)
HTTP_LOGGERS = ("httpx2", "httpx", "httpcore", "urllib3")  # a line per request, at INFO


def download(
    repo_id: str,
    revision: str | None,
    *,
    cache: Path,
    endpoint: str | None = None,
    token: str | None = None,
    allow_pickle: bool = False,
    progress: bool = True,
    verbose: bool = False,
) -> Path:
    """``repo_id`` at ``revision`` (default "main") in ``cache``, fetched where it is not there
    whole yet; its snapshot folder. ``endpoint``: the hub's address (``HF_ENDPOINT``; None: the
    Hugging Face hub); ``token``: ``HF_TOKEN``, for gated and private models. ``verbose``
    (``-v``) logs each HTTP request the HTTP library makes."""
    from huggingface_hub import snapshot_download

    try:
        with http_requests_logged(verbose):
            found = snapshot_download(
                repo_id,
                revision=revision,
                cache_dir=cache,
                endpoint=endpoint,
                token=token or None,
                allow_patterns=read_patterns(allow_pickle),
                tqdm_class=None if progress else Silent,
            )
    except Exception as exc:  # every failure of the library's: said as ours, or a bug re-raised
        raise fetch_error(exc, repo_id, revision, cache=cache, endpoint=endpoint) from None
    return Path(found)


@contextlib.contextmanager
def http_requests_logged(shown: bool) -> Iterator[None]:
    """The HTTP library's line per request (INFO) shown only where asked, for the download."""
    loggers = [logging.getLogger(name) for name in HTTP_LOGGERS]
    before = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.DEBUG if shown else logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, before, strict=True):
            logger.setLevel(level)


def fetch_error(
    exc: Exception, repo_id: str, revision: str | None, *, cache: Path, endpoint: str | None
) -> Exception:
    """The package's error for a failed download, or ``exc`` itself where it is no download's
    failure that huggingface_hub or its HTTP library documents (a bug: exit 1)."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    hub = endpoint or HUB
    named = f'"{repo_id}"' + (f" at revision {revision}" if revision else "")
    for cause in causes(exc):
        if isinstance(cause, RevisionNotFoundError):
            return ModelError(f'"{repo_id}": {hub} has no revision {revision or "main"}')
        if isinstance(cause, GatedRepoError):
            return ModelError(
                f'"{repo_id}" is gated on {hub}: accept its terms there, then set HF_TOKEN '
                "to a token of the account that did"
            )
        if isinstance(cause, RepositoryNotFoundError):
            return ModelError(
                f'"{repo_id}": {hub} has no such model (or it is private: set HF_TOKEN to a '
                "token that may read it)"
            )
        if isinstance(cause, OfflineModeIsEnabled):
            return ModelError(
                f"{named}: HF_HUB_OFFLINE is set, which forbids the network that fetch needs; "
                "unset it for this command"
            )
        if isinstance(cause, HfHubHTTPError) and cause.response is not None:
            status = cause.response.status_code
            if status >= 500 or status == TRANSIENT_STATUS:
                return unreachable(named, hub, f"it answered {status}")
            return ModelError(f"{named}: {hub} refused it ({status}): {first_line(cause)}")
    disk = next((c for c in causes(exc) if isinstance(c, OSError) and c.errno in DISK), None)
    if disk is not None:
        return write_error(repo_folder(cache, repo_id), disk, doing="write the model into")
    if any(isinstance(c, network_errors()) for c in causes(exc)):
        return unreachable(named, hub, first_line(last(exc)))
    return exc


def unreachable(named: str, hub: str, why: str) -> TransientIOError:
    return TransientIOError(
        f"{named}: cannot fetch it from {hub} ({why}); nothing is lost (what arrived is kept "
        "for the next fetch): run it again once the hub is reachable"
    )


def network_errors() -> tuple[type[BaseException], ...]:
    """What the network's failures are raised as: the standard library's, and those of the
    HTTP library huggingface_hub uses (httpx2 in 2.x, httpx in 1.x, requests in 0.x), whichever
    is installed. huggingface_hub raises its own `LocalEntryNotFoundError` when the hub
    cannot be reached and nothing is cached, with the network's error as its cause."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module, name in (
        ("httpx2", "TransportError"),
        ("httpx", "TransportError"),
        ("requests", "ConnectionError"),
        ("requests", "Timeout"),
    ):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes, outermost first (a loop in the chain is walked once)."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def last(exc: BaseException) -> BaseException:
    return causes(exc)[-1]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class Silent(tqdm):  # type: ignore[misc]
    """huggingface_hub's progress bars, never drawn (``--progress off``, or log lines)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)
