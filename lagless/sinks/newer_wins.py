"""Upsert into an Iceberg or Delta table, planned on the driver from a batch's rows and the
rows the table holds for the batch's keys: the same rank as the SQL stores (upsert_order.py),
so every store converges to the same table however the records are batched, whatever order
batches arrive in.

The batch holds one row per key (rows.accepted coalesces); TOMBSTONE marks a deletion. Only
keys and coordinates are compared (in polars); the rows kept are taken from the batch as they
are, whatever their value columns' types. A marked mirror's key changes (cdc/key_change.py)
are planned here too, as sql.py does them: the moves the batch's deletes begin
(`moves_planned`, into `<table>_moves`, where a delete kept only for its move, MOVE_ONLY, goes;
the stores leave those out of the table's plan), the values a row takes from one (`mirrored`)
and the rows that awaited one (`with_fills`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lagless.cdc import key_change
from lagless.cdc.envelope import DELETED
from lagless.cdc.unavailable import kept_columns, unavailable_mask
from lagless.sinks.base import TOMBSTONE, Target, in_schema
from lagless.sinks.sql import SETTLING_ROUNDS, soft_deleted_columns
from lagless.sinks.upsert_order import LOG_TIME, RANK

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
    a row brings as Debezium's placeholder (cdc/unavailable.py), soft deletes, or a marked
    mirror's key changes and the rows that await one (key_change.py). Else the held rows are
    not read."""
    import pyarrow.compute as pc

    if target.value_format != "debezium":
        return False
    if target.deletes == "soft" or key_changes(rows, target):
        return True
    assert target.fields is not None
    for name, data_type in kept_columns(target.fields, target.unique):
        if pc.any(unavailable_mask(rows.column(name), data_type)).as_py():
            return True
    return False


def key_changes(rows: pa.Table, target: Target) -> bool:
    """A marked mirror's batch begins or takes a key change (MOVES, TAKES): its moves are
    kept, and its rows that await one may be filled."""
    import pyarrow.compute as pc

    names = (key_change.MOVES, key_change.TAKES)
    return target.marks and any(
        name in rows.column_names and pc.any(pc.is_valid(rows.column(name))).as_py()
        for name in names
    )


def mirrored(
    planned: Plan, rows: pa.Table, whole: pa.Table, target: Target, moves: pa.Table | None = None
) -> Plan:
    """A Debezium mirror's plan, given `whole`, the held rows of the replaced keys: a column a
    row brings as Debezium's placeholder keeps the held value, or is NULL where no row is held
    (never the placeholder: cdc/unavailable.py); in a marked mirror, a row that takes a key
    change has its moved values (`moves`, the table's key changes), and a value it cannot
    know is marked (key_change.py); with soft deletes, a winning tombstone keeps the held row,
    flagged _deleted, with the tombstone's coordinates."""
    import pyarrow as pa

    kept = _with_held_values(planned, whole, target, moves)
    if target.deletes != "soft":
        return Plan(planned.replaced, kept)
    survivors = _soft_deleted(planned, rows, whole, target, kept.schema)
    return Plan(planned.replaced, pa.concat_tables([kept, survivors]))


def _with_held_values(
    planned: Plan, whole: pa.Table, target: Target, moves: pa.Table | None
) -> pa.Table:
    """The added rows as the table takes them (the batch's key changes resolved, not kept):
    each placeholder replaced by the held value, a key change's moved value, or NULL (marked
    in a marked mirror)."""
    import polars as pl

    assert target.fields is not None
    keys = list(target.unique)
    schema = _fields(
        planned.added,
        [c for c in planned.added.column_names if c not in key_change.BATCH_COLUMNS],
    )
    kept_types = kept_columns(target.fields, target.unique)
    added = _frame(planned.added).with_columns(
        pl.Series(name + UNAVAILABLE_AT, unavailable_mask(planned.added.column(name), data_type))
        for name, data_type in kept_types
    )
    held = _frame(whole).select([c for c in whole.column_names if c in added.columns])
    held = held.rename({c: c + HELD for c in held.columns if c not in keys})
    joined = added.join(held.with_columns(pl.lit(True).alias(HELD)), on=keys, how="left")
    names = [name for name, _ in kept_types]
    if target.marks:
        joined = _with_moved(joined, moves, names)
        joined = joined.with_columns(_resolved(names, pl.col(key_change.TAKES)))
    else:
        joined = joined.with_columns(
            pl.when(~pl.col(name + UNAVAILABLE_AT))
            .then(pl.col(name))
            .when(pl.col(HELD).is_not_null())
            .then(pl.col(name + HELD))
            .otherwise(None)
            .alias(name)
            for name in names
        )
    return joined.select(schema.names).to_arrow().cast(schema)


def _soft_deleted(
    planned: Plan, rows: pa.Table, whole: pa.Table, target: Target, schema: pa.Schema
) -> pa.Table:
    """With soft deletes: the held rows a winning tombstone deletes, kept, flagged _deleted,
    with the tombstone's coordinates (in `schema`, the kept rows')."""
    import polars as pl

    keys = list(target.unique)
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
        .select([c for c in schema.names if c in whole.column_names])
    )
    return in_schema(survivors.to_arrow(), schema)


# Beside a row: the key change it takes, as `<table>_moves` keeps it (its columns suffixed).
MOVED = "_moved"


def _with_moved(frame: pl.DataFrame, moves: pa.Table | None, names: list[str]) -> pl.DataFrame:
    """`frame` with the key change each row takes (TAKES) joined beside it (suffixed MOVED;
    MOVED itself true where one is kept)."""
    import polars as pl

    wanted = [key_change.MOVE_ID, *names, *key_change.MARK_COLUMNS]
    kept = _frame(moves.select(wanted)) if moves is not None and moves.num_rows else None
    if kept is None:
        return frame.with_columns(
            pl.lit(None, pl.Boolean).alias(MOVED),
            *(pl.lit(None, frame.schema[n]).alias(n + MOVED) for n in names),
            *(pl.lit(None, pl.String).alias(n + MOVED) for n in key_change.MARK_COLUMNS),
        )
    kept = kept.rename({c: c + MOVED for c in wanted if c != key_change.MOVE_ID})
    kept = kept.with_columns(pl.lit(True).alias(MOVED)).cast(
        {n + MOVED: frame.schema[n] for n in names}
    )
    return frame.join(
        kept,
        left_on=key_change.TAKES,
        right_on=key_change.MOVE_ID,
        how="left",
        coalesce=False,
        maintain_order="left",
    ).drop(key_change.MOVE_ID, strict=False)


def _has(mark: pl.Expr, name: str) -> pl.Expr:
    """The UNKNOWN `mark` names the column `name` (false for none)."""
    return mark.str.contains(key_change.named(name), literal=True).fill_null(False)


def _marked(conditions: dict[str, pl.Expr]) -> pl.Expr:
    """UNKNOWN naming each column whose condition holds (key_change.marked's text)."""
    import polars as pl

    parts = [
        pl.when(condition).then(pl.lit(key_change.named(name) + ",")).otherwise(pl.lit(""))
        for name, condition in conditions.items()
    ]
    listed = pl.concat_str(parts).str.strip_chars_end(",")
    return pl.when(listed == "").then(None).otherwise(pl.lit("[") + listed + pl.lit("]"))


def _resolved(names: list[str], takes: pl.Expr) -> list[pl.Expr]:
    """Each placeholder of a row (beside it: UNAVAILABLE_AT, the held row suffixed HELD, its
    key change suffixed MOVED) resolved by key_change.py's rules, and its marks."""
    import polars as pl

    held, moved = pl.col(HELD).is_not_null(), pl.col(MOVED).is_not_null()
    unknown = _marked(
        {
            name: pl.col(name + UNAVAILABLE_AT)
            & pl.when(takes.is_null())
            .then(~held | _has(pl.col(key_change.UNKNOWN + HELD), name))
            .otherwise(~moved | _has(pl.col(key_change.UNKNOWN + MOVED), name))
            for name in names
        }
    )
    awaits = (
        pl.when(unknown.is_null())
        .then(None)
        .when(takes.is_null())
        .then(pl.col(key_change.AWAITS + HELD))
        .when(moved)
        .then(pl.col(key_change.AWAITS + MOVED))
        .otherwise(pl.when(takes != "").then(takes))
    )
    values = [
        pl.when(~pl.col(name + UNAVAILABLE_AT))
        .then(pl.col(name))
        .when(takes.is_null())
        .then(pl.col(name + HELD))
        .otherwise(pl.col(name + MOVED))
        .alias(name)
        for name in names
    ]
    return [*values, unknown.alias(key_change.UNKNOWN), awaits.alias(key_change.AWAITS)]


def filled(rows: pl.DataFrame, moves: pl.DataFrame, names: list[str]) -> pl.DataFrame:
    """The rows that await a key change `moves` keeps (one that awaits none, or another one),
    each column they name unknown given its moved value, mark and what it awaits (sql.py's
    fill_awaiting); the others as they are."""
    import polars as pl

    source = moves.select([key_change.MOVE_ID, *names, *key_change.MARK_COLUMNS])
    source = source.rename({c: c + MOVED for c in source.columns if c != key_change.MOVE_ID})
    joined = rows.join(
        source.with_columns(pl.lit(True).alias(MOVED)),
        left_on=key_change.AWAITS,
        right_on=key_change.MOVE_ID,
        how="left",
        coalesce=False,
        maintain_order="left",
    )
    awaits, theirs = pl.col(key_change.AWAITS), pl.col(key_change.AWAITS + MOVED)
    settled = pl.col(MOVED).is_not_null() & (theirs.is_null() | (theirs != awaits))
    mine = pl.col(key_change.UNKNOWN)
    unknown = _marked(
        {name: _has(mine, name) & _has(pl.col(key_change.UNKNOWN + MOVED), name) for name in names}
    )
    changed = [
        *(
            pl.when(_has(mine, name)).then(pl.col(name + MOVED)).otherwise(pl.col(name)).alias(name)
            for name in names
        ),
        unknown.alias(key_change.UNKNOWN),
        pl.when(unknown.is_null()).then(None).otherwise(theirs).alias(key_change.AWAITS),
    ]
    return joined.with_columns(
        pl.when(settled)
        .then(expr)
        .otherwise(pl.col(expr.meta.output_name()))
        .alias(expr.meta.output_name())
        for expr in changed
    ).select(rows.columns)


def moves_planned(rows: pa.Table, held: pa.Table, moves: pa.Table, target: Target) -> Plan:
    """What a batch does to `<table>_moves` (its rows `moves`): each key change its deletes
    begin (MOVES), its values resolved as the row that replaces them would resolve them
    (`held`, the table's rows of those keys; the change it takes), kept once; then each kept
    change that awaits one now kept, filled (again while one fills: a chain)."""
    import polars as pl

    assert target.fields is not None
    names = [name for name, _ in kept_columns(target.fields, target.unique)]
    wanted = [key_change.MOVE_ID, *key_change.MOVED_BY, *names, *key_change.MARK_COLUMNS]
    kept = _frame(moves.select(wanted))
    new = _begun(rows, held, moves, target).select(wanted)
    new = new.join(kept, on=key_change.MOVE_ID, how="anti").cast(kept.schema)
    every = pl.concat([kept, new])
    for _ in range(SETTLING_ROUNDS):
        settled = filled(every, every, names)
        if settled.get_column(key_change.AWAITS).equals(every.get_column(key_change.AWAITS)):
            break
        every = settled
    before = kept.get_column(key_change.AWAITS)
    after = every.head(kept.height).get_column(key_change.AWAITS)
    refilled = kept.get_column(key_change.MOVE_ID).filter(~before.eq_missing(after))
    ids = pl.concat([new.get_column(key_change.MOVE_ID), refilled]).implode()
    changed = every.filter(pl.col(key_change.MOVE_ID).is_in(ids))
    replaced = changed.filter(pl.col(key_change.MOVE_ID).is_in(refilled.implode()))
    return Plan(
        in_schema(replaced.select(key_change.MOVE_ID).to_arrow(), _fields(moves, wanted[:1])),
        in_schema(changed.to_arrow(), _fields(moves, wanted)),
    )


def _begun(rows: pa.Table, held: pa.Table, moves: pa.Table, target: Target) -> pl.DataFrame:
    """The key changes the batch's deletes begin, the first delete of each id (a connector's
    second delivery after it adds nothing), their values resolved (_resolved) with the
    record of the delete (key_change.MOVED_BY), the id as MOVE_ID."""
    import polars as pl
    import pyarrow.compute as pc

    assert target.fields is not None
    kept_types = kept_columns(target.fields, target.unique)
    names = [name for name, _ in kept_types]
    keys = list(target.unique)
    begun = rows.filter(pc.is_valid(rows.column(key_change.MOVES)))
    begun = begun.take(pc.sort_indices(begun, [(n, "ascending") for n in RANK]))
    by = [c for c in key_change.MOVED_BY if c not in keys]
    frame = _frame(begun.select([*keys, *by, *names, key_change.MOVES, key_change.TAKES]))
    frame = frame.with_columns(
        pl.Series(name + UNAVAILABLE_AT, unavailable_mask(begun.column(name), data_type))
        for name, data_type in kept_types
    )
    whole = _frame(held.select([*keys, *names, *key_change.MARK_COLUMNS]))
    whole = whole.rename({c: c + HELD for c in whole.columns if c not in keys})
    held_too = whole.with_columns(pl.lit(True).alias(HELD))
    frame = frame.join(held_too, on=keys, how="left", maintain_order="left")
    frame = _with_moved(frame, moves, names).with_columns(
        _resolved(names, pl.col(key_change.TAKES))
    )
    frame = frame.with_columns(pl.col(key_change.MOVES).alias(key_change.MOVE_ID))
    return frame.unique(key_change.MOVE_ID, keep="first", maintain_order=True)


def _fields(table: pa.Table, names: list[str]) -> pa.Schema:
    import pyarrow as pa

    return pa.schema([table.schema.field(name) for name in names])


def with_fills(planned: Plan, held: pa.Table, moves: pa.Table, target: Target) -> Plan:
    """A marked mirror's plan, its rows that await a key change `moves` now keeps filled: the
    rows it adds, and the held rows (`held`: whole) it leaves, which it then replaces."""
    import polars as pl
    import pyarrow as pa

    assert target.fields is not None
    names = [name for name, _ in kept_columns(target.fields, target.unique)]
    keys = list(target.unique)
    kept = _frame(moves)
    added = filled(_frame(planned.added), kept, names).to_arrow().cast(planned.added.schema)
    left = _frame(held).join(_frame(planned.replaced), on=keys, how="anti")
    waiting = left.filter(pl.col(key_change.AWAITS).is_not_null())
    if not waiting.height:
        return Plan(planned.replaced, added)
    refilled = filled(waiting, kept, names)
    changed = refilled.filter(
        ~refilled.get_column(key_change.AWAITS).eq_missing(waiting.get_column(key_change.AWAITS))
    )
    if not changed.height:
        return Plan(planned.replaced, added)
    rows = in_schema(changed.to_arrow(), added.schema)
    replaced = pa.concat_tables([planned.replaced, rows.select(keys).cast(planned.replaced.schema)])
    return Plan(replaced, pa.concat_tables([added, rows]))


def moves_schema(target: Target) -> pa.Schema:
    """`<table>_moves`'s columns in Arrow's types (sql.py's moves_layout): a key change's
    id, the record of the delete that began it, the moved columns and their marks."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    stored = to_arrow_type(target.schema(), timezone="UTC")
    assert target.fields is not None
    names = [
        *key_change.MOVED_BY,
        *(name for name, _ in kept_columns(target.fields, target.unique)),
        *key_change.MARK_COLUMNS,
    ]
    return pa.schema([pa.field(key_change.MOVE_ID, pa.string()), *(stored.field(n) for n in names)])
