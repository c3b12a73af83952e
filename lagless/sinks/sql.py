"""Table layouts and the SQL that keeps writes idempotent, shared by the SQL stores.

Both layouts are unique on what identifies a record, so a replayed batch inserts nothing new:
the target on (topic, partition, offset) in append mode or on key in upsert mode, the
dead-letter table on (topic, partition, offset).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lagless.sinks.base import COLUMNS, DEAD_LETTER_COLUMNS, Target

Dialect = Literal["sqlite", "postgresql"]

_TYPES: dict[Dialect, dict[str, str]] = {
    "sqlite": {"text": "TEXT", "int": "INTEGER", "bigint": "INTEGER", "bytes": "BLOB"},
    "postgresql": {"text": "text", "int": "integer", "bigint": "bigint", "bytes": "bytea"},
}


def newer(record: str, held: str) -> str:
    """SQL: the record aliased `record` is newer than the row aliased `held`.

    A stored row gives way only to a newer record: a later offset of the same partition or,
    when the key comes from another partition, a later timestamp (then the higher partition on
    a tie). While a key's timestamps do not go back within a partition (LogAppendTime, or one
    producer's clock), this is a total order, so the final table is the same whatever order
    batches and tasks finish in and however often they are replayed."""
    r, h = record, held
    return (
        f'({r}."partition" = {h}."partition" AND {r}."offset" > {h}."offset")'
        f' OR ({r}."partition" <> {h}."partition" AND ({r}."timestamp" > {h}."timestamp"'
        f' OR ({r}."timestamp" = {h}."timestamp" AND {r}."partition" > {h}."partition")))'
    )


NEWER = newer("excluded", "t")


@dataclass(frozen=True)
class Layout:
    table: str
    columns: tuple[tuple[str, str], ...]
    unique: tuple[str, ...]
    newer_only: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)


def target_layout(target: Target) -> Layout:
    kinds = {
        "topic": "text",
        "partition": "int",
        "offset": "bigint",
        "key": "bytes",
        "value": "text" if target.value_format == "json" else "bytes",
        "timestamp": "bigint",
    }
    upsert = target.mode == "upsert"
    return Layout(
        table=target.table,
        columns=tuple((name, kinds[name]) for name in COLUMNS),
        unique=("key",) if upsert else ("topic", "partition", "offset"),
        newer_only=upsert,
    )


def dead_letter_layout(target: Target) -> Layout:
    kinds = {"topic": "text", "partition": "int", "offset": "bigint", "timestamp": "bigint"}
    kinds |= {"key": "bytes", "value": "bytes", "stage": "text", "error": "text"}
    return Layout(
        table=target.dead_letter_table,
        columns=tuple((name, kinds[name]) for name in DEAD_LETTER_COLUMNS),
        unique=("topic", "partition", "offset"),
    )


def quoted(name: str) -> str:
    return f'"{name}"'


def create_table(layout: Layout, dialect: Dialect) -> str:
    types = _TYPES[dialect]
    columns = ", ".join(
        f"{quoted(name)} {types[kind]}{' NOT NULL' if name in layout.unique else ''}"
        for name, kind in layout.columns
    )
    unique = ", ".join(quoted(name) for name in layout.unique)
    return f"CREATE TABLE IF NOT EXISTS {quoted(layout.table)} ({columns}, PRIMARY KEY ({unique}))"


def insert(layout: Layout, rows: str) -> str:
    """INSERT of `rows` (a VALUES list or a SELECT) that a replay cannot double."""
    names = ", ".join(quoted(name) for name in layout.names)
    head = f"INSERT INTO {quoted(layout.table)} AS t ({names}) {rows} ON CONFLICT "
    head += f"({', '.join(quoted(name) for name in layout.unique)}) DO "
    if not layout.newer_only:
        return head + "NOTHING"
    updates = ", ".join(
        f"{quoted(name)} = excluded.{quoted(name)}"
        for name in layout.names
        if name not in layout.unique
    )
    return head + f"UPDATE SET {updates} WHERE {NEWER}"
