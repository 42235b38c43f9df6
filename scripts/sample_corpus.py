"""Build the sample corpus: real English prose every Python install carries, as Parquet shards.

Texts are the standard library's docstrings (read with `ast`, so no module is imported or run)
and the reference topics of `pydoc_data`. Their lengths are long-tailed like real documents: most
are a sentence or two, a few run to pages. The build is deterministic for a given Python.

    python scripts/sample_corpus.py data/docs --shards 8
"""

from __future__ import annotations

import argparse
import ast
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SKIP = {"site-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo", "__phello__"}
MIN_WORDS = 5


def docstrings(root: Path) -> Iterator[tuple[str, str, str]]:
    """(doc_id, kind, text) for every documented module, class and function under ``root``."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIP & set(rel.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        yield from walk(tree, module, "module")


def walk(node: ast.AST, qualname: str, kind: str) -> Iterator[tuple[str, str, str]]:
    text = ast.get_docstring(node)
    if text:
        yield qualname, kind, text
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            child_kind = "class" if isinstance(child, ast.ClassDef) else "function"
            yield from walk(child, f"{qualname}.{child.name}", child_kind)


def corpus() -> pa.Table:
    """Every text once, in a fixed order."""
    from pydoc_data.topics import topics

    rows = list(docstrings(Path(sysconfig.get_paths()["stdlib"])))
    rows += [(f"pydoc.topics.{name}", "topic", topics[name]) for name in sorted(topics)]
    seen: set[str] = set()
    ids, kinds, texts = [], [], []
    for doc_id, kind, text in rows:
        if len(text.split()) < MIN_WORDS or text in seen:
            continue
        seen.add(text)
        ids.append(doc_id)
        kinds.append(kind)
        texts.append(text)
    return pa.table({"doc_id": ids, "kind": kinds, "text": texts})


def write_shards(table: pa.Table, out: Path, shards: int, row_group_size: int = 256) -> None:
    """Split into ``shards`` contiguous Parquet files with small row groups, like real dumps."""
    out.mkdir(parents=True, exist_ok=True)
    size = -(-table.num_rows // shards)
    for i in range(shards):
        part = table.slice(i * size, size)
        pq.write_table(part, out / f"docs-{i:03d}.parquet", row_group_size=row_group_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--limit", type=int, default=None, help="keep only the first N texts")
    args = parser.parse_args()
    table = corpus()
    if args.limit:
        table = table.slice(0, args.limit)
    write_shards(table, args.out, args.shards)
    print(f"wrote {table.num_rows:,} texts in {args.shards} shards to {args.out}")


if __name__ == "__main__":
    main()
