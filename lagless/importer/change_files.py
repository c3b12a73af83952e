"""A Debezium mirror's change events, or a raw upsert's records, kept out of Spark's rows: the
source's tasks decode them, the driver coalesces them, the store upserts one row per key.

On Spark's rows a mirror's batch crossed into the JVM three times (the records, the decoded
rows, the rows shuffled twice for each partition's log time and each key's newest event), and
a batch cost ~1.4 s whatever its size plus ~50 µs an event on two cores (bench/mirror.py).
Here the source's task (its executorWriter, `writer`) decodes its events with the envelope's
rules (cdc/envelope.py; a raw value is the row as read, a null one a tombstone) and writes one
change file for its pieces; the driver reads a batch's
files (`read_changes`), gives each record its log time, the columns a TOASTed value left
UNAVAILABLE their batch's earlier value, and keeps each key's newest event (`coalesce`: the
rules of importer/rows.py's `shape` and `accepted`, which the Spark path keeps); the store
upserts those rows (Sink.upsert_rows). importer/spec.py decides which imports take this way.

A task that meets a row schema its table's columns do not take (a column added upstream)
decodes with the columns grown as the driver will grow the table (cdc/envelope.py `evolved`)
and notes the schema: the driver adds the columns before anything of the batch commits.
Exactly once holds as on every path: a task's file depends only on its pieces (a retried task
replaces it), and the batch's rows commit with its ranges in one step of the store's.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lagless.cdc import columnar, key_change
from lagless.cdc.envelope import (
    ERROR_COLUMN,
    NEW_SCHEMA_COLUMN,
    RAW_COLUMN,
    SKIP_COLUMN,
    TRUNCATE_COLUMN,
    Change,
    Envelope,
    Split,
    evolved,
)
from lagless.cdc.unavailable import kept_columns, placed, unavailable_mask
from lagless.exceptions import BadInput, TerminalError
from lagless.importer.debezium import events_of
from lagless.importer.rows import NULL_KEY, VALIDATE
from lagless.planner.ranges import OffsetRange
from lagless.sinks.base import DEAD_LETTER_SCHEMA, TOMBSTONE, Target, in_schema
from lagless.sinks.ledger import TP
from lagless.sinks.task_files import millis, output_file, pieces_file_name
from lagless.sinks.upsert_order import LOG_TIME

if TYPE_CHECKING:
    import polars as pl
    from pyspark.sql.types import StructType

    from lagless.secret import Secret

WRITER = f"{__name__}:writer"
# Bytes of change events per batch when the user sets no limit: the driver holds a batch's
# decoded rows while it coalesces them (a fifth to a half of the events' JSON).
MAX_BATCH_BYTES = 256 * 1024 * 1024
_INDEX = "_lagless_index"
_UNAVAILABLE = "_lagless_unavailable"


def task_config(folder: str, targets: Mapping[str, Target]) -> str:
    """The writer's JSON config: the folder the tasks write into, and per topic its table's
    name, columns (none: raw values), key and the registry of Avro change events."""
    tables = {}
    for topic, target in targets.items():
        tables[topic] = {
            "table": target.table,
            "fields": target.fields.json() if target.fields is not None else None,
            "key_fields": list(target.key_fields),
            "schema_registry": target.schema_registry,
        }
    return json.dumps({"folder": folder, "tables": tables})


def writer(config: Mapping[str, Any], secret: Secret | None = None) -> ChangeFiles:
    return ChangeFiles(str(config["folder"]), dict(config["tables"]))


class ChangeFiles:
    """The source's executorWriter: a task's change events decoded into one Parquet file of
    `folder` named by its pieces (a retried task writes the same name)."""

    def __init__(self, folder: str, tables: dict[str, dict[str, Any]]) -> None:
        self.folder = folder
        self.tables = tables
        self._envelopes: dict[str, Envelope] = {}
        # Per topic, how its change events are read (importer/debezium.py events_of).
        self._events: dict[str, Split] = {}
        # Per topic, the reading each column's values took last (cdc/columnar.py).
        self._readings: dict[str, dict[str, int]] = {}

    def write(
        self, pieces: Sequence[OffsetRange], batches: Iterator[pa.RecordBatch]
    ) -> tuple[str, str | None]:
        decoded = [self._decode(batch) for batch in batches if batch.num_rows]
        name = pieces_file_name(pieces, ".parquet")
        tables = [pa.Table.from_batches([b]) for b in decoded]
        table = (
            pa.concat_tables(tables, promote_options="default")
            if tables
            else pa.table({"topic": pa.array([], pa.string())})
        )
        with output_file(self.folder, name, None) as where:
            pq.write_table(table, where, compression="snappy")
        return f"{self.folder}/{name}", None

    def _envelope(self, topic: str) -> Envelope:
        from pyspark.sql.types import StructType

        if topic not in self._envelopes:
            table = self.tables.get(topic)
            if table is None:  # the driver prepares a topic's table before its first batch
                raise TerminalError(f"topic {topic!r} has no table in this import's routes")
            fields = StructType.fromJson(json.loads(table["fields"]))
            keys = tuple(table["key_fields"])
            self._events[topic] = events_of(table.get("schema_registry"))
            self._envelopes[topic] = self._made(topic, fields, keys)
        return self._envelopes[topic]

    def _made(self, topic: str, fields: StructType, keys: tuple[str, ...]) -> Envelope:
        return Envelope(fields, keys, "hard", truncates=True, events=self._events[topic])

    def _grown(self, topic: str, schema: str) -> bool:
        """The topic's envelope with the columns `schema` adds, as the driver grows the table;
        False when its change is incompatible (the driver refuses it)."""
        envelope = self._envelopes[topic]
        try:
            fields = evolved(envelope.fields, schema, self.tables[topic]["table"])
        except BadInput:
            return False
        self._envelopes[topic] = self._made(topic, fields, envelope.key_fields)
        return True

    def _decode(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The batch's events decoded: at once where cdc/columnar.py takes the batch (the
        common one), else an event at a time by the envelope's rules."""
        from pyspark.sql.pandas.types import to_arrow_type

        topic = batch.column("topic")[0].as_py()
        table = self.tables.get(topic)
        if table is not None and table["fields"] is None:
            return _raw(batch)
        envelope = self._envelope(topic)
        row_type = to_arrow_type(envelope.fields, timezone="UTC")
        keys, values = batch.column("key"), batch.column("value")
        decoded = columnar.changes(
            envelope, keys, values, row_type, self._readings.setdefault(topic, {})
        )
        if decoded is None:
            decoded, row_type = self._decode_each(topic, keys.to_pylist(), values.to_pylist())
        row = decoded.rows.flatten()
        columns = {name: batch.column(name) for name in ("topic", "partition", "offset", "key")}
        columns["timestamp"] = millis(batch)
        columns |= {f.name: row[i] for i, f in enumerate(row_type)}
        columns |= _key_changes(batch, columns, envelope)
        columns[TOMBSTONE] = decoded.delete
        columns[SKIP_COLUMN] = decoded.skip
        columns[ERROR_COLUMN] = decoded.error
        columns[NEW_SCHEMA_COLUMN] = decoded.new_schema or pa.nulls(batch.num_rows, pa.string())
        columns[RAW_COLUMN] = pc.if_else(pc.is_valid(decoded.error), batch.column("value"), None)
        if decoded.truncate is not None and pc.any(decoded.truncate).as_py():
            columns[TRUNCATE_COLUMN] = decoded.truncate
        return pa.RecordBatch.from_pydict(columns)

    def _decode_each(
        self, topic: str, keys: list[bytes | None], values: list[bytes | None]
    ) -> tuple[columnar.Decoded, pa.StructType]:
        """Envelope.change of each event; a new row schema grows the envelope as the driver
        will grow the table (the batch's later events are read with it)."""
        from pyspark.sql.pandas.types import to_arrow_type

        envelope = self._envelopes[topic]
        changes = []
        for key, value in zip(keys, values, strict=True):
            change = envelope.change(key, value)
            if change.new_schema is not None:
                schema = change.new_schema
                if self._grown(topic, schema):
                    envelope = self._envelopes[topic]
                    change = replace(envelope.change(key, value), new_schema=schema)
                else:
                    change = Change(skip=True, new_schema=schema)  # nothing of the batch commits
            changes.append(change)
        row_type = to_arrow_type(envelope.fields, timezone="UTC")
        return columnar.of_changes(changes, row_type), row_type


def _key_changes(
    batch: pa.RecordBatch, columns: dict[str, pa.Array], envelope: Envelope
) -> dict[str, pa.Array]:
    """A batch's key changes (cdc/key_change.py), where its records carry their headers:
    MOVES and TAKES, and the placeholder in each column of a delete that begins one (the
    row's values, which the driver and the store find); nothing for the common batch."""
    headers = batch.column("headers") if "headers" in batch.schema.names else None
    found = key_change.of_records(batch.column("key"), batch.column("value"), headers)
    if found is None:
        return {}
    moves, takes = found
    begins = pc.is_valid(moves)
    placed_columns = {
        name: placed(columns[name], data_type, begins)
        for name, data_type in kept_columns(envelope.fields, envelope.key_fields)
    }
    return {**placed_columns, key_change.MOVES: moves, key_change.TAKES: takes}


def _raw(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A raw upsert's records as rows (rows.shape's columns for raw values): a null value is a
    tombstone, a null key rejected (NULL_KEY) with the record as read."""
    error = pc.if_else(pc.is_null(batch.column("key")), pa.scalar(NULL_KEY), pa.scalar(None))
    columns = {name: batch.column(name) for name in ("topic", "partition", "offset", "key")}
    columns["value"] = batch.column("value")
    columns["timestamp"] = millis(batch)
    columns[TOMBSTONE] = pc.is_null(batch.column("value"))
    columns[SKIP_COLUMN] = pa.repeat(pa.scalar(False), batch.num_rows)
    columns[ERROR_COLUMN] = error.cast(pa.string())
    columns[NEW_SCHEMA_COLUMN] = pa.nulls(batch.num_rows, pa.string())
    columns[RAW_COLUMN] = pc.if_else(pc.is_valid(error), batch.column("value"), None)
    return pa.RecordBatch.from_pydict(columns)


def clear(folder: str) -> None:
    """Before a batch's tasks run when no other batch's files are read: what a crashed attempt
    left."""
    shutil.rmtree(folder, ignore_errors=True)


def remove(files: list[str]) -> None:
    """A batch's files, once it committed (the next batch's tasks may write beside them)."""
    for path in set(files):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def read_changes(files: list[str]) -> pa.Table:
    """A batch's change files (of one table) as one table; columns a task's file lacks (added
    upstream after it) are NULL."""
    missing = [path for path in sorted(set(files)) if not os.path.exists(path)]
    if missing:  # every task writes its file, an empty one too: the batch is replayed
        raise TerminalError(f"the change file {missing[0]} a task wrote is gone; rerun")
    tables = [pq.read_table(path) for path in sorted(set(files))]
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="default")


def new_schemas(changes: pa.Table) -> list[str]:
    if NEW_SCHEMA_COLUMN not in changes.column_names:
        return []
    return sorted({s for s in changes.column(NEW_SCHEMA_COLUMN).to_pylist() if s is not None})


def grown_fields(fields: StructType, schemas: list[str], table: str) -> StructType:
    """The table's columns once the batch's new row schemas are taken (BadInput: a column
    whose type changed)."""
    for schema in schemas:
        fields = evolved(fields, schema, table)
    return fields


@dataclass(frozen=True)
class Coalesced:
    """A batch's change events made ready for the store: `rows` (the target's row_columns,
    one per key), `rejected` (dead letters, in DEAD_LETTER_COLUMNS), and each partition's
    newest timestamp read (its log time at the batch's end is the newest of that and where
    it started)."""

    rows: pa.Table
    rejected: pa.Table
    newest: dict[TP, int]
    # The batch holds a TRUNCATE_COLUMN: the table is emptied before `rows` (those after it) go in.
    truncated: bool = False


def coalesce(changes: pa.Table, target: Target, carried: Mapping[TP, int]) -> Coalesced:
    """rows.shape and rows.accepted's rules: each record's log time (the running maximum of
    its partition's timestamps from `carried`), each column a key's update left UNAVAILABLE
    its latest earlier value in the batch, then each key's event of the highest rank."""
    import polars as pl

    schema = _row_schema(target)
    if not changes.num_rows:
        return Coalesced(schema.empty_table(), _dead_letters(changes), {})
    keys = list(target.unique)
    order = pl.from_arrow(changes.select(["topic", "partition", "offset", "timestamp"]))
    assert isinstance(order, pl.DataFrame)
    order = order.with_row_index(_INDEX).sort("topic", "partition", "offset")
    carried_frame = pl.DataFrame(
        {
            "topic": [t for t, _ in carried],
            "partition": [p for _, p in carried],
            "_carried": list(carried.values()),
        },
        schema={"topic": pl.String, "partition": pl.Int32, "_carried": pl.Int64},
    )
    ranked = (
        order.with_columns(pl.col("timestamp").cum_max().over("topic", "partition").alias(LOG_TIME))
        .join(carried_frame, on=["topic", "partition"], how="left", maintain_order="left")
        .with_columns(pl.max_horizontal(LOG_TIME, "_carried").alias(LOG_TIME))
    )
    newest = {
        (t, p): int(ms)
        for t, p, ms in ranked.group_by("topic", "partition").agg(pl.col("timestamp").max()).rows()
    }
    sorted_index = pa.array(ranked.get_column(_INDEX).to_numpy())
    in_order = changes.take(sorted_index).append_column(
        LOG_TIME, ranked.get_column(LOG_TIME).to_arrow()
    )
    accepted = in_order.filter(
        pc.and_(pc.is_null(in_order.column(ERROR_COLUMN)), pc.invert(in_order.column(SKIP_COLUMN)))
    )
    truncated = (
        TRUNCATE_COLUMN in in_order.column_names
        and pc.any(in_order.column(TRUNCATE_COLUMN)).as_py()
    )
    if truncated:
        accepted = _after_the_truncate(in_order, accepted)
    if target.marks:
        accepted = _carried_in_batch(accepted, target)
    # upsert_order.RANK, (LOG_TIME, topic, partition, offset), is (LOG_TIME, place) here: the
    # rows are in (topic, partition, offset) order, and numbers sort faster than names.
    rank = pl.from_arrow(accepted.select([*keys, LOG_TIME]))
    assert isinstance(rank, pl.DataFrame)
    winners = (
        rank.with_row_index(_INDEX)
        .sort([LOG_TIME, _INDEX], descending=True)
        .unique(subset=keys, keep="first", maintain_order=True)
        .get_column(_INDEX)
    )
    rows = _with_moves(accepted, winners.to_numpy()) if target.marks else None
    if rows is None:
        rows = accepted.take(pa.array(winners.to_numpy()))
    return Coalesced(in_schema(rows, schema), _dead_letters(in_order), newest, bool(truncated))


def _with_moves(accepted: pa.Table, winners: Any) -> pa.Table | None:
    """The winners, and each delete that begins a key change (MOVES) though a later event of
    its key outranks it, flagged MOVE_ONLY: its move is kept (cdc/key_change.py), the first
    of each id (a connector's second delivery adds nothing). None: the batch begins none."""
    import numpy as np
    import polars as pl

    if key_change.MOVES not in accepted.column_names:
        return None
    moves = accepted.column(key_change.MOVES)
    if not pc.any(pc.is_valid(moves)).as_py():
        return None
    won = np.zeros(accepted.num_rows, bool)
    won[winners] = True
    first = pl.DataFrame({"id": moves.to_pylist()}).with_row_index(_INDEX)
    firsts = first.filter(pl.col("id").is_not_null()).unique("id", keep="first")
    only = np.zeros(accepted.num_rows, bool)
    only[firsts.get_column(_INDEX).to_numpy()] = True
    only &= ~won
    taken = np.flatnonzero(won | only)
    rows = accepted.take(pa.array(taken))
    flag = pa.array(only[taken])
    if key_change.MOVE_ONLY in rows.column_names:
        rows = rows.drop_columns([key_change.MOVE_ONLY])
    return rows.append_column(key_change.MOVE_ONLY, flag)


def _after_the_truncate(in_order: pa.Table, accepted: pa.Table) -> pa.Table:
    """The rows of the events after the batch's last TRUNCATE_COLUMN: in its partition, those of a
    higher offset, exactly; in the others, those of a log time not below the truncate's (a
    partition's running maximum of its records' timestamps, upsert_order.py's order between
    partitions: a row of the same millisecond is kept rather than lost)."""
    cut = in_order.filter(pc.fill_null(in_order.column(TRUNCATE_COLUMN), False))
    columns = [cut.column(c).to_pylist() for c in (LOG_TIME, "topic", "partition", "offset")]
    last = max(zip(*columns, strict=True))
    log_time, topic, partition, offset = last
    same = pc.and_(
        pc.equal(accepted.column("topic"), topic), pc.equal(accepted.column("partition"), partition)
    )
    after = pc.if_else(
        same,
        pc.greater(accepted.column("offset"), offset),
        pc.greater_equal(accepted.column(LOG_TIME), log_time),
    )
    return accepted.filter(after)


def _carried_in_batch(rows: pa.Table, target: Target) -> pa.Table:
    """What a key's earlier events of the batch give a placeholder (cdc/key_change.py; rows.py
    `_carried_in_batch` on Spark's rows: by key and partition, in offset order, which `rows`
    is in): the latest earlier value that is not one; or, where the latest earlier event is a
    create that takes a key change, that change (TAKES), or where it is a delete, nothing
    ("" in TAKES: the store keeps no value for it). A placeholder no earlier event reaches
    takes the store's row."""
    import polars as pl

    assert target.fields is not None
    rows = _with_key_changes(rows)
    group = [*target.unique, "partition"]
    frame = pl.from_arrow(rows.select([*group, TOMBSTONE, key_change.TAKES]))
    assert isinstance(frame, pl.DataFrame)
    found_takes: list[pl.Expr] = []
    for name, data_type in kept_columns(target.fields, target.unique):
        if name not in rows.column_names:
            continue
        column = rows.column(name)
        mask = unavailable_mask(column, data_type)
        if not pc.any(mask).as_py():
            continue
        values = pl.from_arrow(column)
        assert isinstance(values, pl.Series)
        with_column = frame.with_columns(values.alias(name), pl.Series(_UNAVAILABLE, mask))
        filled = _filled(with_column, name, group)
        frame = frame.with_columns(
            filled.get_column(name), filled.get_column(_FOUND).alias(name + _FOUND)
        )
        found_takes.append(pl.col(name + _FOUND))
        kept = frame.get_column(name).to_arrow().cast(column.type)
        rows = rows.set_column(rows.column_names.index(name), name, kept)
    if not found_takes:
        return rows
    takes = frame.select(pl.coalesce(pl.col(key_change.TAKES), *found_takes)).to_series()
    at = rows.column_names.index(key_change.TAKES)
    return rows.set_column(at, key_change.TAKES, takes.to_arrow().cast(pa.string()))


_FOUND = "_lagless_found"


def _filled(frame: pl.DataFrame, name: str, group: list[str]) -> pl.DataFrame:
    """`name` (whose placeholders _UNAVAILABLE marks) filled as _carried_in_batch says, and
    _FOUND: the key change (or "") a placeholder takes from an earlier event."""
    import polars as pl

    unavailable, takes = pl.col(_UNAVAILABLE), pl.col(key_change.TAKES)
    nothing = pl.lit(None, dtype=frame.schema[name])
    source = (
        pl.when(pl.col(TOMBSTONE))
        .then(pl.struct(nothing.alias("v"), pl.lit("").alias("t")))
        .when(~unavailable)
        .then(pl.struct(pl.col(name).alias("v"), pl.lit(None, pl.String).alias("t")))
        .when(takes.is_not_null())
        .then(pl.struct(nothing.alias("v"), takes.alias("t")))
    )
    earlier = source.shift(1).forward_fill().over(group)
    filling = unavailable & takes.is_null() & earlier.is_not_null()
    return frame.select(
        pl.when(filling & earlier.struct.field("t").is_null())
        .then(earlier.struct.field("v"))
        .otherwise(pl.col(name))
        .alias(name),
        pl.when(filling).then(earlier.struct.field("t")).alias(_FOUND),
    )


def _with_key_changes(rows: pa.Table) -> pa.Table:
    """MOVES and TAKES as columns of `rows`, NULL where no task's file had them."""
    for name in (key_change.MOVES, key_change.TAKES):
        if name not in rows.column_names:
            rows = rows.append_column(name, pa.nulls(rows.num_rows, pa.string()))
    return rows


def _row_schema(target: Target) -> pa.Schema:
    """The target's row_columns in the Arrow types Spark's rows would have."""
    from pyspark.sql.pandas.types import to_arrow_type

    stored = to_arrow_type(target.schema(), timezone="UTC")
    flags = [pa.field(TOMBSTONE, pa.bool_())]
    if target.marks:
        flags += key_change.batch_fields()
    # Every column nullable, as Spark's files have them.
    return pa.schema([*(pa.field(f.name, f.type) for f in stored), *flags])


def _dead_letters(changes: pa.Table) -> pa.Table:
    """The rejected change events in DEAD_LETTER_COLUMNS (value: the event as read)."""
    if ERROR_COLUMN not in changes.column_names:
        return DEAD_LETTER_SCHEMA.empty_table()
    rejected = changes.filter(pc.is_valid(changes.column(ERROR_COLUMN)))
    stage = pa.array([VALIDATE] * rejected.num_rows, pa.string())
    return in_schema(
        rejected.drop_columns(["value"] if "value" in rejected.column_names else [])
        .append_column("value", rejected.column(RAW_COLUMN))
        .append_column("stage", stage)
        .append_column("error", rejected.column(ERROR_COLUMN)),
        DEAD_LETTER_SCHEMA,
    )
