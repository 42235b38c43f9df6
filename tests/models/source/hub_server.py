"""A stand-in for the Hugging Face hub on loopback, for `batchscore fetch`'s tests.

It speaks as much of the hub's HTTP API as huggingface_hub's ``snapshot_download`` (2.x) asks
of it, read from the installed library (``_snapshot_download.py``, ``file_download.py``,
``hf_api.py``):

- ``GET /api/models/{repo}/revision/{rev}``: the model's info, whose ``sha`` is the commit the
  branch, tag or commit ``rev`` names (``HfApi.model_info``);
- ``GET /api/models/{repo}/tree/{commit}?recursive=...``: its files, one page, no ``Link``
  header (``HfApi.list_repo_tree``);
- ``HEAD`` and ``GET /{repo}/resolve/{commit}/{path}``: a file, with the headers
  ``hf_hub_download`` needs (``X-Repo-Commit``, ``ETag``, ``Content-Length``), ``Range``
  honoured for a download taken up again (``http_get``).

Errors carry the hub's ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``), which huggingface_hub turns into its own exceptions. Every request is
recorded, so a test can say which files were fetched; ``fail_with`` makes every answer one
status (a hub that is down).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

REPO = r"(?P<repo>[\w.-]+/[\w.-]+)"
INFO = re.compile(rf"^/api/models/{REPO}/revision/(?P<rev>[^/]+)$")
TREE = re.compile(rf"^/api/models/{REPO}/tree/(?P<rev>[^/]+)$")
RESOLVE = re.compile(rf"^/{REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")


@dataclass
class Repo:
    """A model's commits (each a file listing) and its refs (branches and tags)."""

    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)


class Hub:
    """The hub's repositories, the requests it was sent, and its address once started."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self.fail_with: int | None = None
        self.server: ThreadingHTTPServer | None = None

    def add(
        self,
        repo_id: str,
        folder: Path,
        commit: str,
        refs: tuple[str, ...] = ("main",),
        extra: dict[str, bytes] | None = None,
    ) -> None:
        """``folder``'s files (and ``extra``'s) as commit ``commit`` of ``repo_id``."""
        files = {
            str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*"))
            if p.is_file()
        }
        repo = self.repos.setdefault(repo_id, Repo())
        repo.commits[commit] = {**files, **(extra or {})}
        repo.refs.update(dict.fromkeys(refs, commit))

    def commit_of(self, repo_id: str, revision: str) -> str | None:
        repo = self.repos[repo_id]
        return revision if revision in repo.commits else repo.refs.get(revision)

    def fetched(self) -> list[str]:
        """The files whose content was sent (GET), by path in the repository."""
        return [
            found.group("path")
            for method, path in self.requests
            if method == "GET" and (found := RESOLVE.match(path))
        ]

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler(self))
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet: the test reads hub.requests
            pass

        def do_HEAD(self) -> None:
            self.answer(body=False)

        def do_GET(self) -> None:
            self.answer(body=True)

        def answer(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append((self.command, path))
            if hub.fail_with is not None:
                return self.send(hub.fail_with, b"down", body=body)
            for pattern, serve in ((INFO, self.info), (TREE, self.tree), (RESOLVE, self.file)):
                if found := pattern.match(path):
                    repo = found.group("repo")
                    if repo not in hub.repos:
                        return self.send(404, b"{}", body=body, error="RepoNotFound")
                    commit = hub.commit_of(repo, found.group("rev"))
                    if commit is None:
                        return self.send(404, b"{}", body=body, error="RevisionNotFound")
                    return serve(repo, commit, found, body)
            return self.send(404, b"{}", body=body)

        def info(self, repo: str, commit: str, found: re.Match[str], body: bool) -> None:
            files = hub.repos[repo].commits[commit]
            siblings = [{"rfilename": name} for name in sorted(files)]
            info = {"id": repo, "sha": commit, "private": False, "siblings": siblings}
            self.send(200, json.dumps(info).encode(), body=body, commit=commit)

        def tree(self, repo: str, commit: str, found: re.Match[str], body: bool) -> None:
            files = hub.repos[repo].commits[commit]
            listing = [
                {
                    "type": "file",
                    "path": name,
                    "size": len(data),
                    "oid": hashlib.sha1(data).hexdigest(),
                }
                for name, data in sorted(files.items())
            ]
            self.send(200, json.dumps(listing).encode(), body=body, commit=commit)

        def file(self, repo: str, commit: str, found: re.Match[str], body: bool) -> None:
            data = hub.repos[repo].commits[commit].get(found.group("path"))
            if data is None:
                return self.send(404, b"{}", body=body, error="EntryNotFound", commit=commit)
            etag = hashlib.sha256(data).hexdigest()
            start = 0
            if ranged := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", "")):
                start = int(ranged.group(1))
            status = 206 if start else 200
            extra = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"} if start else {}
            self.send(status, data[start:], body=body, commit=commit, etag=etag, **extra)

        def send(
            self,
            status: int,
            content: bytes,
            *,
            body: bool,
            error: str | None = None,
            commit: str | None = None,
            etag: str | None = None,
            **headers: str,
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(content)))
            self.send_header("Content-Type", "application/json")
            if error:
                self.send_header("X-Error-Code", error)
            if commit:
                self.send_header("X-Repo-Commit", commit)
            if etag:
                self.send_header("ETag", f'"{etag}"')
            for name, value in headers.items():
                self.send_header(name.replace("_", "-"), value)
            self.end_headers()
            if body:
                self.wfile.write(content)

    return Handler
