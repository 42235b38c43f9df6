"""A small Iceberg REST catalog server on loopback, for the tests: no Python package serves
the Iceberg REST catalog offline (production teams run Polaris, Lakekeeper, Nessie, Gravitino
or a vendor's, none of which runs here), so this one implements the endpoints pyiceberg's
``RestCatalog`` calls for the tests' work (config; namespaces: create, load, exists; tables:
create, load, exists, commit, register), backed by a pyiceberg SQL catalog on SQLite, with the
REST specification's request and response models (pyiceberg's own) and its error shape. It is
a test fixture, not a catalog to run: no auth, no paging, no views, no credential vending."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from pyiceberg.catalog.rest import CreateTableRequest, RegisterTableRequest, TableResponse
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.table import CommitTableRequest
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER

ERRORS = {  # pyiceberg's exception -> the REST status and error type the client maps back
    NoSuchNamespaceError: (404, "NoSuchNamespaceException"),
    NoSuchTableError: (404, "NoSuchTableException"),
    NamespaceAlreadyExistsError: (409, "AlreadyExistsException"),
    TableAlreadyExistsError: (409, "AlreadyExistsException"),
    CommitFailedException: (409, "CommitFailedException"),
}
NAMESPACE = re.compile(r"/v1/namespaces/([^/]+)$")
TABLES = re.compile(r"/v1/namespaces/([^/]+)/tables$")
TABLE = re.compile(r"/v1/namespaces/([^/]+)/tables/([^/]+)$")
REGISTER = re.compile(r"/v1/namespaces/([^/]+)/register$")


def namespace(part: str) -> tuple[str, ...]:
    return tuple(unquote(part).split("\x1f"))  # a nested namespace's levels, as REST joins them


class Handler(BaseHTTPRequestHandler):
    catalog: SqlCatalog

    def log_message(self, *args: Any) -> None:  # quiet: the tests' output is pytest's
        pass

    def reply(self, status: int, body: Any = None) -> None:
        data = (
            b""
            if body is None
            else body.encode()
            if isinstance(body, str)
            else json.dumps(body).encode()
        )
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def table(self, table: Any) -> str:
        found = TableResponse(metadata_location=table.metadata_location, metadata=table.metadata)
        return found.model_dump_json(by_alias=True)

    def handle_one(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            self.route(method, path, body)
        except tuple(ERRORS) as exc:
            status, kind = ERRORS[type(exc)]
            self.reply(status, {"error": {"message": str(exc), "type": kind, "code": status}})

    def route(self, method: str, path: str, body: bytes) -> None:
        cat = self.catalog
        if path == "/v1/config":
            return self.reply(200, {"defaults": {}, "overrides": {}})
        if path == "/v1/namespaces" and method == "POST":
            asked = json.loads(body)
            cat.create_namespace(tuple(asked["namespace"]), asked.get("properties") or {})
            return self.reply(200, {"namespace": asked["namespace"], "properties": {}})
        if m := NAMESPACE.match(path):
            props = cat.load_namespace_properties(namespace(m[1]))
            return (
                self.reply(204)
                if method == "HEAD"
                else self.reply(200, {"namespace": list(namespace(m[1])), "properties": props})
            )
        if (m := TABLES.match(path)) and method == "POST":
            asked = CreateTableRequest.model_validate_json(body)
            made = cat.create_table(
                (*namespace(m[1]), asked.name),
                schema=asked.table_schema,
                location=asked.location,
                partition_spec=asked.partition_spec or UNPARTITIONED_PARTITION_SPEC,
                sort_order=asked.write_order or UNSORTED_SORT_ORDER,
                properties=asked.properties,
            )
            return self.reply(200, self.table(made))
        if m := REGISTER.match(path):
            asked = RegisterTableRequest.model_validate_json(body)
            made = cat.register_table((*namespace(m[1]), asked.name), asked.metadata_location)
            return self.reply(200, self.table(made))
        if m := TABLE.match(path):
            found = cat.load_table((*namespace(m[1]), unquote(m[2])))
            if method == "POST":
                asked = CommitTableRequest.model_validate_json(body)
                done = cat.commit_table(found, asked.requirements, asked.updates)
                return self.reply(200, done.model_dump_json(by_alias=True))
            return self.reply(204) if method == "HEAD" else self.reply(200, self.table(found))
        return self.reply(404, {"error": {"message": path, "type": "NotFound", "code": 404}})

    def do_GET(self) -> None:
        self.handle_one("GET")

    def do_POST(self) -> None:
        self.handle_one("POST")

    def do_HEAD(self) -> None:
        self.handle_one("HEAD")


@contextmanager
def rest_catalog(folder: Path) -> Iterator[str]:
    """A REST catalog server on a loopback port, its SQL catalog in ``folder``; yields its
    URL, and stops it after."""
    folder.mkdir(parents=True, exist_ok=True)
    backing = SqlCatalog("backing", uri=f"sqlite:///{folder / 'rest.db'}", warehouse=str(folder))
    handler = type("Bound", (Handler,), {"catalog": backing})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
