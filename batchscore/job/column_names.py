"""Column names as the engines that read an output folder compare them: regardless of case.

DuckDB, Spark and Hive resolve ``select label`` to a column named ``Label`` just as well, so two
names that differ only in case are one column to them, and a reader gets one of the two. Such
names are refused wherever the output's names meet: the carried columns among themselves and
against the task's columns.
"""

from __future__ import annotations

from collections.abc import Iterable


def same_column(a: str, b: str) -> bool:
    """Whether a case-insensitive reader takes ``a`` and ``b`` for one column."""
    return a.casefold() == b.casefold()


def clashes(names: Iterable[str], taken: Iterable[str]) -> list[tuple[str, str]]:
    """Each (name, taken name) pair that a case-insensitive reader takes for one column."""
    taken = list(taken)
    return [(name, other) for name in names for other in taken if same_column(name, other)]


def case_twins(names: Iterable[str]) -> list[tuple[str, str]]:
    """Pairs among ``names`` that differ only in case (the same name twice is one column)."""
    unique = list(dict.fromkeys(names))
    return [(a, b) for i, a in enumerate(unique) for b in unique[i + 1 :] if same_column(a, b)]
