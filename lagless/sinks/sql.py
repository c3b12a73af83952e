"""Table layouts and the SQL that keeps writes idempotent, shared by the SQL stores.

A layout comes from the rows' Spark schema (`Target.schema`), each type mapped to the dialect's.
Every layout is unique on what identifies a record, so a replayed batch inserts nothing new:
the target on (topic, partition, offset) in append mode or on the key in upsert mode, the
dead-letter table on (topic, partition, offset), the tombstone memory on the key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from lagless.cdc import key_change
from lagless.cdc.envelope import CDC_COLUMNS, DELETED, defaults
from lagless.cdc.schema_change import every_widening, refuse, widest
from lagless.cdc.unavailable import UNAVAILABLE, UNAVAILABLE_BYTES, kept_columns, unavailable_json
from lagless.exceptions import BadInput
from lagless.sinks.base import TOMBSTONE, Target
from lagless.sinks.ledger import TP, Batch, HeldRecord
from lagless.sinks.upsert_order import LOG_TIME, newer_sql

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructField

Dialect = Literal["sqlite", "postgresql"]

# By Spark type name. SQLite keeps decimals, dates and timestamps as text (exact, and ordered
# as written), nested values as JSON text; PostgreSQL has them all, nested values as jsonb.
_TYPES: dict[Dialect, dict[str, str]] = {
    "sqlite": {
        "string": "TEXT",
        "binary": "BLOB",
        "boolean": "INTEGER",
        "tinyint": "INTEGER",
        "smallint": "INTEGER",
        "int": "INTEGER",
        "bigint": "INTEGER",
        "float": "REAL",
        "double": "REAL",
        "decimal": "TEXT",
        "date": "TEXT",
        "timestamp": "TEXT",
        "timestamp_ntz": "TEXT",
        "nested": "TEXT",
    },
    "postgresql": {
        "string": "text",
        "binary": "bytea",
        "boolean": "boolean",
        "tinyint": "smallint",
        "smallint": "smallint",
        "int": "integer",
        "bigint": "bigint",
        "float": "real",
        "double": "double precision",
        "decimal": "numeric",
        "date": "date",
        "timestamp": "timestamp with time zone",
        "timestamp_ntz": "timestamp without time zone",
        "nested": "jsonb",
    },
}
# Columns of this type arrive as text and are cast on insert.
_CAST_ON_INSERT = ("jsonb",)


def newer(record: str, held: str) -> str:
    """SQL: the record aliased `record` is newer than the row aliased `held`: it outranks it
    (upsert_order.py, the one rule of every store)."""
    return newer_sql(record, held)


NEWER = newer("excluded", "t")


def sql_type(data_type: DataType, dialect: Dialect) -> str:
    from pyspark.sql.types import ArrayType, DecimalType, MapType, StructType

    if isinstance(data_type, ArrayType | MapType | StructType):
        return _TYPES[dialect]["nested"]
    if isinstance(data_type, DecimalType) and dialect == "postgresql":
        return f"numeric({data_type.precision},{data_type.scale})"
    name = data_type.simpleString().split("(")[0]
    if name not in _TYPES[dialect]:
        raise BadInput(f"a {data_type.simpleString()} field cannot be stored in {dialect}")
    return _TYPES[dialect][name]


@dataclass(frozen=True)
class Layout:
    table: str
    columns: tuple[tuple[str, str], ...]  # name, SQL type
    unique: tuple[str, ...]
    newer_only: bool = False
    # Debezium: columns whose placeholder (a TOASTed value an update did not change:
    # cdc/unavailable.py) keeps the stored one, or is NULL where none is stored, each with
    # the placeholder's SQL literal in the column's type.
    keeps: tuple[tuple[str, str], ...] = ()
    # Debezium: a column the table has and the rows lack (dropped upstream) stays, NULL in
    # new rows; other tables refuse it.
    extra_columns_stay: bool = False
    # Debezium --deletes soft: a tombstone sets these (and _deleted) instead of deleting.
    soft_delete: tuple[str, ...] = ()
    # Debezium: a column's Connect default as an SQL literal: the value the rows already held
    # take when the column is added.
    defaults: tuple[tuple[str, str], ...] = ()
    # A marked mirror's (Target.marks): its rows name the values it cannot know, and its key
    # changes' moves lie in this table (cdc/key_change.py).
    moves_table: str | None = None
    dialect: Dialect = "sqlite"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)

    @property
    def casts_on_insert(self) -> bool:
        """Some column arrives as text and is cast on insert: rows cannot be copied as is."""
        return any(kind in _CAST_ON_INSERT for _, kind in self.columns)


def _column_type(target: Target, field: StructField, dialect: Dialect) -> str:
    if target.fields is None and target.value_format == "json" and field.name == "value":
        # A JSON value without a schema is JSON as nested fields are: jsonb in PostgreSQL.
        return _TYPES[dialect]["nested"]
    return sql_type(field.dataType, dialect)


def target_layout(target: Target, dialect: Dialect) -> Layout:
    mirror = target.value_format == "debezium"
    return Layout(
        table=target.table,
        columns=tuple((f.name, _column_type(target, f, dialect)) for f in target.schema().fields),
        unique=target.unique,
        newer_only=target.mode == "upsert",
        keeps=_keeps(target, dialect) if mirror and target.mode == "upsert" else (),
        extra_columns_stay=mirror,
        soft_delete=soft_deleted_columns(target) if target.deletes == "soft" else (),
        defaults=_defaults(target, dialect) if mirror else (),
        moves_table=target.moves_table if target.marks else None,
        dialect=dialect,
    )


def moves_layout(target: Target, dialect: Dialect) -> Layout:
    """A marked mirror's key changes: each one's id, the values its delete moved (the
    columns Debezium may send as its placeholder) and their marks."""
    held = dict(target_layout(target, dialect).columns)
    assert target.fields is not None
    kept = [name for name, _ in kept_columns(target.fields, target.unique)]
    return Layout(
        table=target.moves_table,
        columns=(
            (key_change.MOVE_ID, _TYPES[dialect]["string"]),
            *((name, held[name]) for name in key_change.MOVED_BY),
            *((name, held[name]) for name in kept),
            *((name, _TYPES[dialect]["string"]) for name in key_change.MARK_COLUMNS),
        ),
        unique=(key_change.MOVE_ID,),
        keeps=tuple((name, literal) for name, literal in _keeps(target, dialect)),
        extra_columns_stay=True,
        dialect=dialect,
    )


def _defaults(target: Target, dialect: Dialect) -> tuple[tuple[str, str], ...]:
    """Each column's Connect default as an SQL literal (numbers, booleans, text, decimals; a
    default of another type is not given to the rows the column finds)."""
    from pyspark.sql.types import BooleanType, DecimalType, NumericType, StringType

    found = []
    kinds = {f.name: f.dataType for f in target.fields or []}
    for name, value in defaults(target.fields).items() if target.fields else ():
        kind = kinds[name]
        if isinstance(kind, BooleanType):
            literal = ("1" if value else "0") if dialect == "sqlite" else str(bool(value)).upper()
        elif isinstance(kind, StringType | DecimalType):
            literal = _literal(str(value))
        elif isinstance(kind, NumericType):
            literal = repr(value)
        else:
            continue
        found.append((name, literal))
    return tuple(found)


def soft_deleted_columns(target: Target) -> tuple[str, ...]:
    """What a soft delete sets beside _deleted: the rank's columns the newer-only rule reads
    (upsert_order.py), the timestamp, the Kafka key, and the mirror's own columns."""
    own = tuple(n for n in CDC_COLUMNS if target.fields and n in target.fields.fieldNames())
    return ("topic", "partition", "offset", "timestamp", LOG_TIME, "key", *own)


def _keeps(target: Target, dialect: Dialect) -> tuple[tuple[str, str], ...]:
    from pyspark.sql.types import BinaryType

    assert target.fields is not None
    found = []
    for name, data_type in kept_columns(target.fields, target.unique):
        nested = unavailable_json(data_type)
        if nested is not None:
            literal = _literal(nested) + ("::jsonb" if dialect == "postgresql" else "")
        elif not isinstance(data_type, BinaryType):
            literal = _literal(UNAVAILABLE)
        elif dialect == "sqlite":
            literal = f"X'{UNAVAILABLE_BYTES.hex()}'"
        else:
            literal = f"'\\x{UNAVAILABLE_BYTES.hex()}'::bytea"
        found.append((name, literal))
    return tuple(found)


def tombstone_layout(target: Target, dialect: Dialect) -> Layout:
    """The key of each deleted row and the coordinates of the tombstone that deleted it (its
    rank: upsert_order.py)."""
    kept = (*target.unique, "partition", "offset", "timestamp", "topic", LOG_TIME)
    columns = target_layout(target, dialect).columns
    return Layout(
        table=target.tombstone_table,
        columns=tuple(c for c in columns if c[0] in kept),
        unique=target.unique,
        newer_only=True,
    )


def dead_letter_layout(target: Target, dialect: Dialect) -> Layout:
    types = _TYPES[dialect]
    kinds = {"topic": "string", "partition": "int", "offset": "bigint", "timestamp": "bigint"}
    kinds |= {"key": "binary", "value": "binary", "stage": "string", "error": "string"}
    return Layout(
        table=target.dead_letter_table,
        columns=tuple((name, types[kind]) for name, kind in kinds.items()),
        unique=("topic", "partition", "offset"),
    )


def ledger_layout(target: Target, dialect: Dialect) -> Layout:
    """The offsets each committed batch covered, per partition (ledger.py): written in the
    batch's transaction."""
    types = _TYPES[dialect]
    return Layout(
        table=target.ledger_table,
        columns=(
            ("topic", types["string"]),
            ("partition", types["int"]),
            ("start_offset", types["bigint"]),
            ("end_offset", types["bigint"]),
            # Upsert: the partition's log time at end_offset (upsert_order.py); else NULL.
            (LOG_TIME, types["bigint"]),
            # The records of the range the table never took (Batch.skipped); else NULL.
            ("skipped", types["bigint"]),
        ),
        unique=("topic", "partition", "start_offset"),
    )


def record_ranges(layout: Layout, batch: Batch) -> list[str]:
    """The statement that adds the batch's ranges (and its log times) to the ledger (none for
    an empty batch); a replay changes nothing, a longer range from the same start widens the
    entry."""
    rows = ", ".join(
        f"({_literal(topic)}, {int(partition)}, {int(start)}, {int(end)}, "
        f"{_number(batch.log_times.get((topic, partition)))}, "
        f"{_number(batch.skipped.get((topic, partition)))})"
        for (topic, partition), (start, end) in batch.covered.items()
    )
    if not rows:
        return []
    log_time = quoted(LOG_TIME)
    return [
        f"INSERT INTO {quoted(layout.table)} AS t ({', '.join(quoted(n) for n in layout.names)}) "
        f"VALUES {rows} ON CONFLICT ({', '.join(quoted(n) for n in layout.unique)}) DO UPDATE "
        'SET "end_offset" = CASE WHEN excluded."end_offset" > t."end_offset" '
        'THEN excluded."end_offset" ELSE t."end_offset" END, '
        f"{log_time} = CASE WHEN t.{log_time} IS NULL OR excluded.{log_time} > t.{log_time} "
        f'THEN excluded.{log_time} ELSE t.{log_time} END, "skipped" = '
        'COALESCE(t."skipped", excluded."skipped")'
    ]


def held_offsets(layout: Layout) -> str:
    """A query: (topic, partition, the first offset above what the table holds)."""
    return (
        f'SELECT "topic", "partition", MAX("end_offset") FROM {quoted(layout.table)} '
        'GROUP BY "topic", "partition"'
    )


def by_partition(rows: Iterable[tuple[Any, Any, Any]]) -> dict[TP, int]:
    """The rows of a ledger query (held_offsets, log_times) as partition -> its number."""
    return {(topic, int(partition)): int(value) for topic, partition, value in rows}


def log_times(layout: Layout) -> str:
    """A query: (topic, partition, its log time where the table's ledger ends; upsert_order):
    a running maximum, so the largest of its entries."""
    return (
        f'SELECT "topic", "partition", MAX({quoted(LOG_TIME)}) FROM {quoted(layout.table)} '
        f'WHERE {quoted(LOG_TIME)} IS NOT NULL GROUP BY "topic", "partition"'
    )


def skipped_offsets(layout: Layout) -> str:
    """A query: (topic, partition, the records its entries skipped; Batch.skipped)."""
    return (
        f'SELECT "topic", "partition", SUM("skipped") FROM {quoted(layout.table)} '
        'WHERE "skipped" > 0 GROUP BY "topic", "partition"'
    )


def newest_rows(table: str) -> str:
    """A query: (topic, partition, offset, timestamp, key) of each partition's row of the
    highest offset in `table` (ledger.recreated compares it with the log). Append tables
    find it by their unique key; an upsert table is scanned."""
    t = quoted(table)
    return (
        f'SELECT r."topic", r."partition", r."offset", r."timestamp", r."key" FROM {t} AS r '
        f'JOIN (SELECT "topic", "partition", MAX("offset") AS "top" FROM {t} '
        'GROUP BY "topic", "partition") AS m ON r."topic" = m."topic" '
        'AND r."partition" = m."partition" AND r."offset" = m."top"'
    )


def held_records(conn: Any, table: str, held: Mapping[TP, int]) -> dict[TP, HeldRecord]:
    """Sink.newest_rows of `table`, asked on a DB-API connection (sqlite3's, psycopg's)."""
    if not held:
        return {}
    found = {
        (str(topic), int(partition)): HeldRecord(
            int(offset), None if stamp is None else int(stamp), None if key is None else bytes(key)
        )
        for topic, partition, offset, stamp, key in conn.execute(newest_rows(table)).fetchall()
    }
    return {tp: row for tp, row in found.items() if tp in held}


def _number(value: int | None) -> str:
    return "NULL" if value is None else str(int(value))


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def layouts(target: Target, dialect: Dialect) -> list[Layout]:
    """Every table an import into target writes."""
    found = [
        target_layout(target, dialect),
        dead_letter_layout(target, dialect),
        ledger_layout(target, dialect),
    ]
    if target.mode == "upsert":
        found.append(tombstone_layout(target, dialect))
    if target.marks:
        found.append(moves_layout(target, dialect))
    return found


def quoted(name: str) -> str:
    return f'"{name}"'


def create_table(layout: Layout) -> str:
    columns = ", ".join(
        f"{quoted(name)} {kind}{' NOT NULL' if name in layout.unique else ''}"
        for name, kind in layout.columns
    )
    unique = ", ".join(quoted(name) for name in layout.unique)
    return f"CREATE TABLE IF NOT EXISTS {quoted(layout.table)} ({columns}, PRIMARY KEY ({unique}))"


def evolve(layout: Layout, found: list[tuple[str, str]], keyed: tuple[str, ...]) -> list[str]:
    """The statements that bring an existing table (its columns and types `found`, unique on
    `keyed`) to `layout`: a column for each field the schema added (a mirror's rows take its
    default), a mirror's column widened in place (PostgreSQL; SQLite's types are loose).
    BadInput for any other difference: another unique key, a column the layout lacks, a column
    of another type (SchemaChangeRefused for a mirror's)."""
    if not found:
        return [create_table(layout), *_awaiting_index(layout)]
    types = {name: kind.lower() for name, kind in found}
    extra = set(types) - set(layout.names)
    if keyed != layout.unique or (extra and not layout.extra_columns_stay):
        raise BadInput(
            f"table {layout.table!r} exists with another layout (columns "
            f"{', '.join(types)}; unique on {', '.join(keyed) or 'nothing'}); pick another "
            "--table, --write mode or --value-schema"
        )
    table = quoted(layout.table)
    statements = []
    for name, kind in layout.columns:
        if name == "value" and (types.get(name), kind) == ("text", "jsonb"):
            raise BadInput(
                f"table {layout.table!r} keeps JSON values as text (made by an earlier lagless; "
                f"they are jsonb now): convert it once with ALTER TABLE {table} "
                f'ALTER COLUMN "value" TYPE jsonb USING "value"::jsonb, or pick another --table'
            )
        held = types.get(name)
        if held is not None and held != kind.lower() and _wider(layout, name, held, kind.lower()):
            statements.append(f"ALTER TABLE {table} ALTER COLUMN {quoted(name)} TYPE {kind}")
    defaults = dict(layout.defaults)
    for name, kind in layout.columns:
        if name not in types:
            statements.append(f"ALTER TABLE {table} ADD COLUMN {quoted(name)} {kind}")
            if name in defaults:
                statements.append(f"UPDATE {table} SET {quoted(name)} = {defaults[name]}")
    return statements + _awaiting_index(layout)


def _awaiting_index(layout: Layout) -> list[str]:
    """A marked table's rows whose values it cannot know, found without a scan: those that
    await a key change (fill_awaiting), and their count (unknown_count)."""
    if key_change.AWAITS not in layout.names:
        return []
    return [
        f"CREATE INDEX IF NOT EXISTS {quoted(layout.table + '_unknown')} ON "
        f"{quoted(layout.table)} ({quoted(key_change.AWAITS)}) WHERE {_UNKNOWN_ROWS}"
    ]


_UNKNOWN_ROWS = f"{quoted(key_change.UNKNOWN)} IS NOT NULL"


def unknown_count(table: str) -> str:
    """A query: the rows of a marked table whose values it cannot know (Sink.unknown_rows)."""
    return f"SELECT count(*) FROM {quoted(table)} WHERE {_UNKNOWN_ROWS}"


# The SQL types a mirror's column may be widened between, as Spark's (schema_change.py).
_WIDENED = {
    "smallint": "ShortType",
    "integer": "IntegerType",
    "bigint": "LongType",
    "real": "FloatType",
    "double precision": "DoubleType",
}


def spark_type(kind: str) -> DataType | None:
    from pyspark.sql import types

    if kind.startswith("numeric(") and kind.endswith(")"):
        precision, _, scale = kind[len("numeric(") : -1].partition(",")
        return types.DecimalType(int(precision), int(scale or 0))
    return getattr(types, _WIDENED[kind])() if kind in _WIDENED else None


def _wider(layout: Layout, name: str, held: str, wanted: str) -> bool:
    """A column of `layout` the table holds as `held` and the rows bring as `wanted`: True to
    widen it in place, False when the table's type takes the rows' values already. BadInput
    (SchemaChangeRefused for a mirror's) when neither holds the other's values."""
    held_type, wanted_type = spark_type(held), spark_type(wanted)
    wider = None
    if held_type is not None and wanted_type is not None:
        wider = widest(held_type, wanted_type)
    if wider is not None and wider in (held_type, wanted_type):
        return wider == wanted_type and every_widening(held_type, wider)  # type: ignore[arg-type]
    if layout.extra_columns_stay:
        refuse(layout.table, name, held_type or held, wanted_type or wanted)
    raise BadInput(
        f"incompatible schema change: column {name!r} of table {layout.table!r} is "
        f"{held}, the schema makes it {wanted}; pick another --table"
    )


def _selected(layout: Layout, alias: str) -> str:
    """The columns of `alias`'s rows as the table takes them: Debezium's placeholder is NULL
    where the table holds no row of the key to keep a value from (ON CONFLICT keeps it); in a
    marked mirror, a row that takes a key change has its moved values (cdc/key_change.py)."""
    kept = dict(layout.keeps)
    held = " AND ".join(f"h.{quoted(k)} = {alias}.{quoted(k)}" for k in layout.unique)
    holds = f"EXISTS (SELECT 1 FROM {quoted(layout.table)} AS h WHERE {held})"
    selected = []
    for name in layout.names:
        value = _staged(layout, alias, name)
        takes = f"{alias}.{quoted(key_change.TAKES)}"
        if name in kept:
            moved = f"WHEN {takes} IS NOT NULL THEN mv.{quoted(name)} " if _marked(layout) else ""
            value = (
                f"CASE WHEN {value} = {kept[name]} THEN CASE {moved}"
                f"WHEN {holds} THEN {value} END ELSE {value} END"
            )
        elif _marked(layout) and name in key_change.MARK_COLUMNS:
            value = _marks_taken(layout, alias, holds)[name]
        selected.append(value)
    return ", ".join(selected)


def _marked(layout: Layout) -> bool:
    """A marked mirror's table, whose rows may take a key change's moved values."""
    return layout.moves_table is not None


def _staged(layout: Layout, alias: str, name: str) -> str:
    """A column of `alias`'s rows in the table's type (a nested value arrives as JSON text)."""
    kind = dict(layout.columns)[name]
    value = f"{alias}.{quoted(name)}"
    return f"CAST({value} AS {kind})" if kind in _CAST_ON_INSERT else value


def _placeholder(layout: Layout, alias: str, name: str) -> str:
    """SQL: `alias`'s column `name` holds Debezium's placeholder (false for NULL)."""
    return f"COALESCE({_staged(layout, alias, name)} = {dict(layout.keeps)[name]}, FALSE)"


def _has(layout: Layout, mark: str, name: str) -> str:
    """SQL: the UNKNOWN `mark` names the column `name` (NULL when `mark` is)."""
    found = "instr" if layout.dialect == "sqlite" else "strpos"
    return f"{found}({mark}, {_literal(key_change.named(name))}) > 0"


def _mark(layout: Layout, conditions: dict[str, str]) -> str:
    """SQL: UNKNOWN naming each kept column whose condition holds (key_change.marked)."""
    if not conditions:
        return "NULL"
    parts = " || ".join(
        f"CASE WHEN {condition} THEN {_literal(key_change.named(name) + ',')} ELSE '' END"
        for name, condition in conditions.items()
    )
    # The text is built only for a row that names a column (rare): no string work per row.
    some = " OR ".join(f"({condition})" for condition in conditions.values())
    return f"CASE WHEN {some} THEN '[' || rtrim({parts}, ',') || ']' END"


def _marks_taken(layout: Layout, alias: str, holds: str) -> dict[str, str]:
    """UNKNOWN and AWAITS of `alias`'s rows as inserted: a placeholder where no row of the key
    is held, or that takes a key change not kept yet (AWAITS it) or not known there."""
    takes = f"{alias}.{quoted(key_change.TAKES)}"
    unknown = _mark(
        layout,
        {
            name: f"{_placeholder(layout, alias, name)} AND (CASE WHEN {takes} IS NULL THEN NOT "
            f"{holds} ELSE mv.{quoted(key_change.MOVE_ID)} IS NULL OR "
            f"{_has(layout, 'mv.' + quoted(key_change.UNKNOWN), name)} END)"
            for name, _ in layout.keeps
        },
    )
    awaits = (
        f"CASE WHEN {takes} IS NULL OR {unknown} IS NULL THEN NULL WHEN "
        f"mv.{quoted(key_change.MOVE_ID)} IS NOT NULL THEN mv.{quoted(key_change.AWAITS)} "
        f"ELSE NULLIF({takes}, '') END"
    )
    return {key_change.UNKNOWN: unknown, key_change.AWAITS: awaits}


def _marks_kept(layout: Layout) -> dict[str, str]:
    """UNKNOWN and AWAITS of a row that replaces a held one: the held marks of the columns it
    brings as the placeholder (it keeps their values), with its own."""
    unknown = _mark(
        layout,
        {
            name: f"{_has(layout, 'excluded.' + quoted(key_change.UNKNOWN), name)} OR "
            f"(excluded.{quoted(name)} = {literal} AND "
            f"{_has(layout, 't.' + quoted(key_change.UNKNOWN), name)})"
            for name, literal in layout.keeps
        },
    )
    held, mark = quoted(key_change.AWAITS), quoted(key_change.UNKNOWN)
    # The common row: neither it nor the held one marks a column.
    none = f"excluded.{mark} IS NULL AND t.{mark} IS NULL"
    awaits = (
        f"CASE WHEN {none} OR {unknown} IS NULL THEN NULL WHEN excluded.{mark} "
        f"IS NOT NULL THEN excluded.{held} ELSE t.{held} END"
    )
    return {
        key_change.UNKNOWN: f"CASE WHEN {none} THEN NULL ELSE {unknown} END",
        key_change.AWAITS: awaits,
    }


def insert(layout: Layout, source: str, where: str = "true") -> str:
    """INSERT of the rows of `source` (a table or a subquery, as `s`) matching `where` that a
    replay cannot double."""
    names = ", ".join(quoted(name) for name in layout.names)
    moves = ""
    if layout.moves_table is not None:  # _marked
        moves = (
            f" LEFT JOIN {quoted(layout.moves_table)} AS mv ON "
            f"mv.{quoted(key_change.MOVE_ID)} = s.{quoted(key_change.TAKES)}"
        )
    # WHERE: without one SQLite reads ON CONFLICT as a join's ON.
    rows = f"SELECT {_selected(layout, 's')} FROM {source} AS s{moves} WHERE {where}"
    head = f"INSERT INTO {quoted(layout.table)} AS t ({names}) {rows} ON CONFLICT "
    head += f"({', '.join(quoted(name) for name in layout.unique)}) DO "
    if not layout.newer_only:
        return head + "NOTHING"
    kept = dict(layout.keeps)
    marks = _marks_kept(layout) if moves else {}
    updates = ", ".join(
        f"{quoted(name)} = "
        + (
            f"CASE WHEN excluded.{quoted(name)} = {kept[name]} THEN t.{quoted(name)} "
            f"ELSE excluded.{quoted(name)} END"
            if name in kept
            else marks.get(name, f"excluded.{quoted(name)}")
        )
        for name in layout.names
        if name not in layout.unique
    )
    return head + f"UPDATE SET {updates} WHERE {NEWER}"


class Settling(str):
    """A statement the store runs again while it changes rows, up to SETTLING_ROUNDS times: a
    chain of key changes settles one link a round (settle_moves)."""


SETTLING_ROUNDS = 32


def record_moves(target: Layout, moves: Layout, source: str) -> str:
    """The batch's key changes (`source`'s deletes with MOVES) kept, once each (the first
    delete of an id, a connector's second delivery adding nothing): the values its delete
    moved, each kept column resolved as the row replacing it would resolve it (the held row,
    or the change its placeholders take), marked where unknown."""
    takes = f"s.{quoted(key_change.TAKES)}"
    on_key = " AND ".join(f"h.{quoted(k)} = s.{quoted(k)}" for k in target.unique)
    held = f"h.{quoted(target.unique[0])} IS NOT NULL"
    found = f"mv.{quoted(key_change.MOVE_ID)} IS NOT NULL"
    values, unknown = [], {}
    for name, _ in target.keeps:
        column = quoted(name)
        values.append(
            f"CASE WHEN NOT ({_placeholder(target, 's', name)}) THEN {_staged(target, 's', name)}"
            f" WHEN {takes} IS NULL THEN h.{column} ELSE mv.{column} END"
        )
        unknown[name] = (
            f"{_placeholder(target, 's', name)} AND (CASE WHEN {takes} IS NULL THEN NOT {held} "
            f"OR {_has(target, 'h.' + quoted(key_change.UNKNOWN), name)} ELSE NOT {found} OR "
            f"{_has(target, 'mv.' + quoted(key_change.UNKNOWN), name)} END)"
        )
    mark = _mark(target, unknown)
    awaits = (
        f"CASE WHEN {mark} IS NULL THEN NULL WHEN {takes} IS NULL THEN "
        f"h.{quoted(key_change.AWAITS)} WHEN {found} THEN mv.{quoted(key_change.AWAITS)} "
        f"ELSE NULLIF({takes}, '') END"
    )
    names = ", ".join(quoted(n) for n in moves.names)
    return (
        f"INSERT INTO {quoted(moves.table)} ({names}) SELECT s.{quoted(key_change.MOVES)}, "
        f"{', '.join(f's.{quoted(n)}' for n in key_change.MOVED_BY)}, "
        f"{', '.join(values)}, {mark}, {awaits} FROM {source} AS s "
        f"LEFT JOIN {quoted(target.table)} AS h ON {on_key} "
        f"LEFT JOIN {quoted(moves.table)} AS mv ON mv.{quoted(key_change.MOVE_ID)} = {takes} "
        f"WHERE s.{quoted(key_change.MOVES)} IS NOT NULL AND NOT EXISTS (SELECT 1 FROM "
        f"{source} AS e WHERE e.{quoted(key_change.MOVES)} = s.{quoted(key_change.MOVES)} "
        f"AND {newer('s', 'e')}) ON CONFLICT ({quoted(key_change.MOVE_ID)}) DO NOTHING"
    )


def fill_awaiting(table: Layout, moves: Layout) -> str:
    """The rows of `table` (the mirror's, or its moves') that await a key change now kept:
    each column they name unknown takes its moved value (and its mark, and what that awaits).
    Found through the partial index of the rows marked unknown (_awaiting_index)."""
    unknown, awaits = quoted(key_change.UNKNOWN), quoted(key_change.AWAITS)
    known = _mark(
        table,
        {
            name: f"{_has(table, 't.' + unknown, name)} AND {_has(table, 'src.' + unknown, name)}"
            for name, _ in table.keeps
        },
    )
    sets = [
        f"{quoted(name)} = CASE WHEN {_has(table, 't.' + unknown, name)} THEN src.{quoted(name)} "
        f"ELSE t.{quoted(name)} END"
        for name, _ in table.keeps
    ]
    sets += [
        f"{unknown} = {known}",
        f"{awaits} = CASE WHEN {known} IS NULL THEN NULL ELSE src.{awaits} END",
    ]
    return (
        f"UPDATE {quoted(table.table)} AS t SET {', '.join(sets)} "
        f"FROM {quoted(moves.table)} AS src "
        f"WHERE t.{unknown} IS NOT NULL AND t.{awaits} = src.{quoted(key_change.MOVE_ID)} "
        f"AND (src.{awaits} IS NULL OR src.{awaits} <> t.{awaits})"
    )


def _soft_delete(
    target: Layout, source: str, same_key: Callable[[str, str], str], deleted: str
) -> str:
    """--deletes soft: a tombstone (`deleted`) newer than its key's row flags the row _deleted
    and takes its coordinates (so the newer-only rule goes on), rather than deleting it. A join
    from the batch's rows, not a subquery per row of the table."""
    table = quoted(target.table)
    sets = ", ".join(
        [f"{quoted(DELETED)} = true", *(f"{quoted(n)} = s.{quoted(n)}" for n in target.soft_delete)]
    )
    return (
        f"UPDATE {table} SET {sets} FROM {source} AS s WHERE {deleted} "
        f"AND {same_key('s', table)} AND ({newer('s', table)})"
    )


def upsert(
    target: Layout, tombstones: Layout, source: str, moves: Layout | None = None
) -> list[str]:
    """The statements, in order, that upsert `source` (rows with a TOMBSTONE column): a
    tombstone deletes its key's row when newer and is remembered newer-only; a record is
    stored when newer than the row and than its key's remembered tombstone. The final table is
    then the same whatever order batches arrive in, however often they are replayed. A marked
    mirror's key changes are kept first (`moves`: record_moves), from the rows the batch
    replaces; the target's statement is the last (after it: awaiting_filled)."""

    def same_key(a: str, b: str) -> str:
        return " AND ".join(f"{a}.{quoted(k)} = {b}.{quoted(k)}" for k in target.unique)

    recorded: list[str] = []
    rows = "true"
    if moves is not None:
        recorded = [record_moves(target, moves, source), Settling(fill_awaiting(moves, moves))]
        # A delete kept only for its move (MOVE_ONLY) is no row of the batch's.
        rows = f"s.{quoted(key_change.MOVE_ONLY)} IS NOT TRUE"
    deleted = f"s.{quoted(TOMBSTONE)} AND {rows}"
    # The keys to delete, found from the batch's rows: a subquery per row of the table (EXISTS)
    # read the whole batch for each (SQLite: 13k rows x 100k tombstones took minutes).
    keys = ", ".join(quoted(k) for k in target.unique)
    doomed = (
        f"SELECT {', '.join(f's.{quoted(k)}' for k in target.unique)} FROM {source} AS s "
        f"JOIN {quoted(target.table)} AS h ON {same_key('s', 'h')} "
        f"WHERE {deleted} AND ({newer('s', 'h')})"
    )
    delete = f"DELETE FROM {quoted(target.table)} WHERE ({keys}) IN ({doomed})"
    if target.soft_delete:
        delete = _soft_delete(target, source, same_key, deleted)
    outlived = (
        f"NOT EXISTS (SELECT 1 FROM {quoted(tombstones.table)} AS d "
        f"WHERE {same_key('d', 's')} AND NOT ({newer('s', 'd')}))"
    )
    return [
        *recorded,
        delete,
        insert(tombstones, source, deleted),
        insert(target, source, f"NOT s.{quoted(TOMBSTONE)} AND {rows} AND {outlived}"),
    ]


def awaiting_filled(target: Layout, moves: Layout | None) -> list[str]:
    """After a marked mirror's upsert: its rows that await a key change now kept take the
    moved values (fill_awaiting)."""
    return [] if moves is None else [fill_awaiting(target, moves)]
