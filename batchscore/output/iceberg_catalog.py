"""Where an Iceberg output table lives: its catalog, its location, the files' I/O settings.

By default the table (its metadata and data files) lives at ``[output].path`` itself,
registered in pyiceberg's SQL catalog on a SQLite file beside the output's lock
(`batchscore.storage.layout.catalog_file`: ``_batchscore/iceberg.db`` in a local folder), so no
server is needed. A catalog is only a pointer to the table's newest metadata file: batchscore
also writes ``metadata/version-hint.text`` after each commit, so any Iceberg reader opens the
table from the folder alone (pyiceberg's ``StaticTable``, DuckDB's ``iceberg_scan``, polars),
and a catalog that lost the table (its SQLite file deleted, an object-store output resumed on
another machine) has it registered again from the newest metadata file in the folder. Another
writer works on the table through the same catalog (for the default, the SQLite file).

A catalog the job names (``properties``: pyiceberg's catalog properties, a REST catalog's
``uri`` say) is used as it is; the table is still created at the output's location. Files in
an object store are read and written through pyiceberg's FileIO, which does not read the
standard ``AWS_*`` variables as pyarrow's own filesystems do: `file_io` passes them on from
the environment the caller hands in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from batchscore.storage.fs import is_url
from batchscore.storage.layout import catalog_file
from batchscore.storage.store import Store

NAME = "batchscore"  # the catalog's name, as pyiceberg names a catalog
IDENTIFIER = "batchscore.scores"  # the table in its own SQL catalog: namespace.name
METADATA = "metadata"  # the table's metadata folder, under its location
HINT = f"{METADATA}/version-hint.text"
# a metadata file a catalog names a commit by: its sequence and a uuid (pyiceberg, Java)
METADATA_NAME = re.compile(r"(?:v)?([0-9]+)(?:-[0-9a-f-]+)?\.metadata\.json")
# the standard AWS variables, as pyiceberg's FileIO properties
AWS = {
    "AWS_ENDPOINT_URL_S3": "s3.endpoint",
    "AWS_ENDPOINT_URL": "s3.endpoint",
    "AWS_ACCESS_KEY_ID": "s3.access-key-id",
    "AWS_SECRET_ACCESS_KEY": "s3.secret-access-key",
    "AWS_SESSION_TOKEN": "s3.session-token",
    "AWS_REGION": "s3.region",
    "AWS_DEFAULT_REGION": "s3.region",
}
# what a table batchscore creates keeps of its own metadata: each commit writes a whole new
# metadata file (with every chunk's state), so without this a folder of thousands of commits
# grows by all of them (Iceberg's own property; another writer may change it)
CREATED = {
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "100",
}


def location(store: Store) -> str:
    """The table's location: the output folder's absolute path, or its URL."""
    url = store.url.rstrip("/")
    return url if is_url(url) else str(Path(url).absolute())


def file_io(url: str, env: Mapping[str, str]) -> dict[str, str]:
    """pyiceberg's FileIO properties for an output at ``url``: for S3, the standard AWS
    variables of ``env`` (the first of two that name one setting wins)."""
    # named, not guessed: pyiceberg says "Defaulting to PyArrow FileIO" on every open otherwise
    found: dict[str, str] = {"py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO"}
    if not url.startswith(("s3://", "s3a://")):
        return found
    for variable, prop in AWS.items():
        if env.get(variable) and prop not in found:
            found[prop] = env[variable]
    return found


def open_catalog(store: Store, properties: Mapping[str, str] | None, io: dict[str, str]) -> Any:
    """The catalog: the job's (``properties``), or the SQL catalog on the output's own SQLite
    file; ``io``: the FileIO properties its tables read and write files with."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.catalog.sql import SqlCatalog

    if properties:
        return load_catalog(NAME, **{**io, **properties})
    db = catalog_file(store.lock_path)
    db.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return SqlCatalog(NAME, uri=f"sqlite:///{db}", warehouse=location(store), **io)


def identifier_of(text: str) -> tuple[str, ...]:
    """``namespace.name`` (a nested namespace: ``a.b.name``) as pyiceberg's identifier."""
    return tuple(text.split("."))


def load(catalog: Any, identifier: tuple[str, ...], store: Store) -> Any:
    """The table, or None where there is none: from the catalog, else registered from the
    newest metadata file in the output folder (a catalog that lost it)."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        pass
    newest = newest_metadata(store)
    if newest is None:
        return None
    catalog.create_namespace_if_not_exists(identifier[:-1])
    return catalog.register_table(identifier, f"{location(store)}/{METADATA}/{newest}")


def newest_metadata(store: Store) -> str | None:
    """The name of the newest metadata file in the output's metadata folder (None: none)."""
    found = [(int(m.group(1)), n) for n in store.names(METADATA) if (m := METADATA_NAME.match(n))]
    return max(found)[1] if found else None


def create(catalog: Any, identifier: tuple[str, ...], store: Store, schema: Any) -> Any:
    """Make the table at the output's location with columns ``schema`` (an Arrow schema),
    or load it where another process made it first."""
    catalog.create_namespace_if_not_exists(identifier[:-1])
    return catalog.create_table_if_not_exists(
        identifier, schema=schema, location=location(store), properties=CREATED
    )


def write_hint(store: Store, metadata_location: str) -> None:
    """Point ``metadata/version-hint.text`` at the table's current metadata file, where it
    lies in the output's own metadata folder (readers that open the folder alone read it)."""
    folder, _, name = metadata_location.rpartition("/")
    if folder == f"{location(store)}/{METADATA}" and name.endswith(".metadata.json"):
        version = name.removesuffix(".metadata.json")
        if store.read_text(HINT) != version:  # a run with nothing to commit writes nothing
            store.write_text(HINT, version)
