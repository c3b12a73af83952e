"""Upsert into an Iceberg or Delta table, planned on the driver from a batch's rows and the
rows the table holds for the batch's keys: the same rank as the SQL stores (upsert_order.py),
so every store converges to the same table however the records are batched, whatever order
batches arrive in.

The batch holds one row per key (rows.accepted coalesces); TOMBSTONE marks a deletion. Only
keys and coordinates are compared (in polars); the rows kept are taken from the batch as they
are, whatever their value columns' types."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lagless.cdc.envelope import DELETED
from lagless.cdc.unavailable import kept_columns, unavailable_mask
from lagless.sinks.base import TOMBSTONE, Target
from lagless.sinks.sql import soft_deleted_columns
from lagless.sinks.upsert_order import LOG_TIME

if TYPE_CHECKING:
    import polars as pl
    import pyarrow as pa

# A row's rank (upsert_order.py) is read from these; the last two came later (a table an
# earlier lagless made has them empty).
COORDINATES = ("partition", "offset", "timestamp", "topic", LOG_TIME)
HELD = "_held"
# Beside a column: where the batch's row brings Debezium's placeholder.
UNAVAILABLE_AT = "_unavailable"
ROW = "_row"


@dataclass(frozen=True)
class Plan:
    # Keys whose stored row goes (a newer record replaces it, or a newer tombstone deletes it).
    replaced: pa.Table
    # The batch's rows to add (records, not tombstones), without TOMBSTONE.
    added: pa.Table


def newer_than_held() -> pl.Expr:
    """The batch's row outranks the held one joined beside it (columns suffixed HELD), or
    there is none (upsert_order.py, with a missing row as lowest)."""
    import polars as pl

    def rank(suffix: str) -> list[pl.Expr]:
        return [
            pl.coalesce(pl.col(LOG_TIME + suffix), pl.col("timestamp" + suffix)),
            pl.col("topic" + suffix).fill_null(""),
            pl.col("partition" + suffix),
            pl.col("offset" + suffix),
        ]

    mine, theirs = rank(""), rank(HELD)
    newer = mine[-1] > theirs[-1]
    for a, b in zip(reversed(mine[:-1]), reversed(theirs[:-1]), strict=True):
        newer = (a > b) | ((a == b) & newer)
    return pl.col("offset" + HELD).is_null() | newer


def plan(
    rows: pa.Table, held: pa.Table, keys: tuple[str, ...], tombstones: pa.Table | None = None
) -> Plan:
    """What a batch does to a table holding `held` (its rows of the batch's keys: the keys and
    COORDINATES): a row replaces a held one only if newer, a tombstone deletes it only if
    newer; with `tombstones` (the newest tombstone of each key), a record older than its key's
    tombstone is dropped."""
    import polars as pl

    compared = _frame(rows.select([*keys, *COORDINATES, TOMBSTONE])).with_row_index(ROW)
    if tombstones is not None and tombstones.num_rows:
        compared = (
            compared.join(_held(tombstones, keys), on=list(keys), how="left")
            .filter(pl.col(TOMBSTONE) | newer_than_held())
            .select(compared.columns)
        )
    winning = compared.join(_held(held, keys), on=list(keys), how="left").filter(newer_than_held())
    replaced = winning.filter(pl.col("offset" + HELD).is_not_null()).get_column(ROW).sort()
    added = winning.filter(~pl.col(TOMBSTONE)).get_column(ROW).sort()
    return Plan(
        rows.select(list(keys)).take(replaced.to_arrow()),
        rows.drop_columns([TOMBSTONE]).take(added.to_arrow()),
    )


def _frame(table: pa.Table) -> pl.DataFrame:
    import polars as pl

    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def _held(table: pa.Table, keys: tuple[str, ...]) -> pl.DataFrame:
    frame = _frame(table.select([*keys, *COORDINATES]))
    return frame.rename({c: c + HELD for c in COORDINATES})


def row_numbers(count: int) -> pa.Array:
    """0 .. count-1, as int64 (through numpy: a Python range of a million takes ~50 ms)."""
    import numpy as np
    import pyarrow as pa

    return pa.array(np.arange(count, dtype=np.int64))


def keyed_positions(rows: pa.Table, keys: pa.Table) -> pa.Array:
    """The positions of the rows whose key is a row of `keys`, in order (int64)."""
    import pyarrow.compute as pc

    names = keys.column_names
    places = rows.select(names).append_column("_lagless_place", row_numbers(rows.num_rows))
    # A join carries only the keys and a row's place: Arrow's join takes no list column.
    found = places.join(keys, names, join_type="left semi").column("_lagless_place")
    return pc.take(found, pc.sort_indices(found)).combine_chunks()


def needs_held_values(rows: pa.Table, target: Target) -> bool:
    """A Debezium mirror's batch takes values from the rows it replaces (mirrored): a column
    a row brings as Debezium's placeholder (cdc/unavailable.py), or soft deletes. Else the
    held rows are not read."""
    import pyarrow.compute as pc

    if target.value_format != "debezium":
        return False
    if target.deletes == "soft":
        return True
    assert target.fields is not None
    for name, data_type in kept_columns(target.fields, target.unique):
        if pc.any(unavailable_mask(rows.column(name), data_type)).as_py():
            return True
    return False


def mirrored(planned: Plan, rows: pa.Table, whole: pa.Table, target: Target) -> Plan:
    """A Debezium mirror's plan, given `whole`, the held rows of the replaced keys: a column a
    row brings as Debezium's placeholder keeps the held value, or is NULL where no row is held
    (never the placeholder: cdc/unavailable.py); with soft deletes, a winning tombstone keeps
    the held row, flagged _deleted, with the tombstone's coordinates."""
    import polars as pl
    import pyarrow as pa

    assert target.fields is not None
    keys = list(target.unique)
    columns = planned.added.column_names
    added = _frame(planned.added)
    held = _frame(whole).select([c for c in whole.column_names if c in added.columns])
    held = held.rename({c: c + HELD for c in held.columns if c not in keys})
    kept_types = kept_columns(target.fields, target.unique)
    added = added.with_columns(
        pl.Series(name + UNAVAILABLE_AT, unavailable_mask(planned.added.column(name), data_type))
        for name, data_type in kept_types
    )
    joined = added.join(held.with_columns(pl.lit(True).alias(HELD)), on=keys, how="left")
    for name, _ in kept_types:
        joined = joined.with_columns(
            pl.when(~pl.col(name + UNAVAILABLE_AT))
            .then(pl.col(name))
            .when(pl.col(HELD).is_not_null())
            .then(pl.col(name + HELD))
            .otherwise(None)
            .alias(name)
        )
    kept = joined.select(columns).to_arrow().cast(planned.added.schema)
    if target.deletes != "soft":
        return Plan(planned.replaced, kept)
    deleted = (
        _frame(rows).filter(pl.col(TOMBSTONE)).join(_frame(planned.replaced), on=keys, how="semi")
    )
    flagged = soft_deleted_columns(target)
    survivors = (
        _frame(whole)
        .join(deleted.select([*keys, *flagged]), on=keys, how="inner", suffix=HELD)
        .with_columns(
            *(pl.col(name + HELD).alias(name) for name in flagged if name not in keys),
            pl.lit(True).alias(DELETED),
        )
        .select(planned.added.column_names)
    )
    return Plan(
        planned.replaced,
        pa.concat_tables([kept, survivors.to_arrow().cast(planned.added.schema)]),
    )
