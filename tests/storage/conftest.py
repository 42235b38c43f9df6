"""Fixtures of the object-store tests: a proxy in front of the S3 test server (moto's, on
loopback) that answers the requests a test picks with 503 SlowDown, S3's throttling."""

from __future__ import annotations

import http.client
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


class Flaky:
    """Which requests fail: ``failures`` in a row for each request whose method and path match."""

    def __init__(self, method: str, path_part: str, failures: int) -> None:
        self.method, self.path_part, self.failures = method, path_part, failures
        self.failed: dict[str, int] = {}
        self.lock = threading.Lock()

    def should_fail(self, method: str, path: str) -> bool:
        if method != self.method or self.path_part not in path:
            return False
        key = path.split("?")[0]  # the object, whichever upload or part of it
        with self.lock:
            count = self.failed.get(key, 0)
            self.failed[key] = count + 1
            return count < self.failures


def start_proxy(upstream_url: str, rules: list[Flaky]) -> ThreadingHTTPServer:
    """An HTTP proxy to ``upstream_url`` on a loopback port that answers requests a rule picks
    with 503 SlowDown, and forwards the others."""
    target = urlsplit(upstream_url)

    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # answers "Expect: 100-continue", keeps connections

        def body(self) -> bytes:
            if "chunked" not in self.headers.get("Transfer-Encoding", ""):
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))
            parts = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return b"".join(parts)

        def forward(self) -> None:
            body = self.body()
            if any(rule.should_fail(self.command, self.path) for rule in rules):
                self.send_response(503)
                self.send_header("Content-Length", str(len(SLOW_DOWN)))
                self.end_headers()
                self.wfile.write(SLOW_DOWN)
                return
            dropped = ("expect", "transfer-encoding", "content-length")
            headers = {k: v for k, v in self.headers.items() if k.lower() not in dropped}
            headers["Content-Length"] = str(len(body))
            upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
            upstream.request(self.command, self.path, body=body, headers=headers)
            reply = upstream.getresponse()
            payload = reply.read()
            self.send_response(reply.status)
            for key, value in reply.getheaders():
                if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(key, value)
            length = reply.getheader("Content-Length") if self.command == "HEAD" else None
            self.send_header("Content-Length", length or str(len(payload)))  # HEAD: the object's
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = forward

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def flaky_s3(s3_server: str) -> Iterator[list[Flaky]]:
    """A proxy to the S3 server, with the rules a test adds; the standard AWS_ENDPOINT_URL
    points at it for the test's duration."""
    rules: list[Flaky] = []
    server = start_proxy(s3_server, rules)
    saved = os.environ["AWS_ENDPOINT_URL"]
    os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield rules
    finally:
        os.environ["AWS_ENDPOINT_URL"] = saved
        server.shutdown()
