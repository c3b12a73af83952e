"""Debezium's change event, as the row a mirror stores or the key it deletes.

The rules, all of them here:

- A value is Debezium's envelope `{"before", "after", "op", "source", ...}`, in Kafka Connect's
  JSON with its schema (`{"schema": ..., "payload": ...}`) or without it, or in Avro through
  a schema registry (Confluent's AvroConverter: importer/debezium.py's AvroEvents reads it as
  the JSON's schema and payload, cdc/avro_schema.py). A reading is a `Split`; a key or value
  it cannot read is rejected with its reason (NOT_JSON, or the Avro wire format's).
- op `r` (snapshot), `c`, `u`: the row `after` is upserted on the primary key, which is the
  Kafka key's fields (every column of `after`, converted by connect_types).
- op `d`: the key's row is deleted (`--deletes soft`: kept, `_deleted` true, and the mirror's
  own columns of the delete); the key from the Kafka key, else from `before` (`--key-field`
  on a table whose Kafka key lacks it; REPLICA IDENTITY FULL sends the whole row there).
- A tombstone (a null value, which follows each delete for log compaction): deletes the key's
  row, which the delete before it removed already: it changes nothing (one whose key does
  not give the table's key is skipped). Soft deletes skip it,
  and so does the change log itself (`--write append`: a row per change event, flattened).
- A primary-key change arrives as a delete of the old key and a create of the new: two keys,
  one row in the end, with the old row's TOASTed values (cdc/key_change.py).
- Which of two events of a key wins is the upsert path's rule (sinks/sql.py `newer`: the later
  offset of the key's partition), so a replayed batch changes nothing; Debezium's own replays
  (at least once: a restarted connector sends again what followed its last offset flush) come
  in their order again, ending where the first delivery ended.
- A TOASTed column an update did not change comes as Debezium's placeholder, in its type's
  form: the row keeps the column's value, or takes a key change's (cdc/key_change.py), or is
  NULL and marked where the mirror cannot know it (the stores' upserts; cdc/unavailable.py),
  never the placeholder.
- An event whose `after` has a column the table lacks, or a column of a wider type, carries
  its schema (`Change.new_schema`): the import adds the column (nullable; its Connect default
  the value of the rows and events that predate it) or widens it in place, and writes the
  batch again; a type neither the table's nor a widening of it is refused
  (cdc/schema_change.py). An event of a narrower type is stored in the wider column. A column
  dropped upstream stays, NULL (or its default) in new rows.
- op `t` (a TRUNCATE; Debezium skips them unless `skipped.operations=none`) empties the
  table of every row written before it, once, where the source's tasks decode the events
  (importer/change_files.py); on Spark's rows it is rejected as other ops are.
- Other ops (`m` message) and values that are not envelopes are rejected with their reason
  (dead letters).
- A value its column cannot take (a date out of range, text in a number column of
  --value-schema, ...: connect_types) rejects its event alone, with the column and the
  reason (`UNSTORABLE`); every other event goes on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import orjson
from pyspark.sql.types import BooleanType, LongType, StringType

from lagless.cdc.connect_types import Column, for_spark_type, struct_columns
from lagless.cdc.schema_change import refuse, takes, widest

if TYPE_CHECKING:
    from pyspark.sql.types import StructField, StructType

Deletes = Literal["hard", "soft"]

# The mirror's own columns (--cdc-columns; _deleted with --deletes soft).
OP, SOURCE_TS_MS, LSN, DELETED = "_op", "_source_ts_ms", "_lsn", "_deleted"
CDC_COLUMNS = (OP, SOURCE_TS_MS, LSN)
CDC_TYPES = {OP: StringType, SOURCE_TS_MS: LongType, LSN: LongType, DELETED: BooleanType}
# The columns decoding adds beside a change's row, wherever it is decoded (the records of the
# Spark path, importer/debezium.py; the tasks' change files, importer/change_files.py): why
# the event was refused, a delete, an event to skip, a new schema, the value of a refused
# event, a TRUNCATE.
ERROR_COLUMN, DELETE_COLUMN, SKIP_COLUMN = "_lagless_error", "_lagless_delete", "_lagless_skip"
NEW_SCHEMA_COLUMN, RAW_COLUMN = "_lagless_schema", "_lagless_raw"
TRUNCATE_COLUMN = "_lagless_truncate"

NOT_JSON = "value is not valid JSON"
NOT_AN_EVENT = "value is not a Debezium change event (no op)"
OTHER_OP = "change event of an op a mirror does not apply (truncate, message)"
NO_AFTER = "change event without its after row"
KEY_MISSING = "change event whose Kafka key does not give the key fields"
# A table field's metadata key: its Connect default (field_of).
DEFAULT = "connect.default"
UNSTORABLE = "change event with a value its column cannot take"
REASONS = (NOT_JSON, NOT_AN_EVENT, OTHER_OP, NO_AFTER, KEY_MISSING, UNSTORABLE)
# What a column's conversion raises on a value it cannot take (binascii.Error and
# decimal's errors are ValueError and ArithmeticError).
CONVERSION_ERRORS = (ValueError, TypeError, ArithmeticError, KeyError, AttributeError)

SCHEMA_HEAD = b'{"schema":'
PAYLOAD_AT = b',"payload":'


class Undecodable(ValueError):
    """A key or value its format does not read; its text the reason, as dead letters give it."""


# How change events are read: a key or value as (its Connect schema's JSON text, or None when
# it carries none; its payload), each schema always the same text; ValueError when it is
# unreadable (Undecodable: with the reason). `split` reads Kafka Connect's JSON.
Split = Callable[[bytes], tuple[bytes | None, Any]]


@dataclass(frozen=True)
class Change:
    """What one event does to the mirror: upsert `row`, delete the key `row` holds (`delete`),
    nothing (`skip`), or nothing because it is rejected (`error`). `new_schema`: the event's
    row schema (JSON) when the table's columns do not take it yet."""

    row: dict[str, Any] | None = None
    delete: bool = False
    skip: bool = False
    error: str | None = None
    new_schema: str | None = None
    # A TRUNCATE (op t; Debezium sends them with skipped.operations=none): the table is
    # emptied of every row written before it (importer/change_files.py `coalesce`).
    truncate: bool = False


def _loads(text: bytes) -> Any:
    """JSON parsed by orjson, four times faster than json here (a mirror's events are parsed
    one at a time in the source's tasks); json's reading where orjson refuses what json takes
    (NaN, integers past 64 bits). ValueError when it is not JSON."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def split(value: bytes) -> tuple[bytes | None, Any]:
    """(the schema's JSON text or None, the payload parsed). Kafka Connect's JsonConverter
    writes the schema first: only the payload is parsed, the schema's text is the cache key of
    what it means (ValueError when the value is not JSON)."""
    if value.startswith(SCHEMA_HEAD) and value.endswith(b"}"):
        at = value.find(PAYLOAD_AT)
        if at > 0:
            try:
                return value[len(SCHEMA_HEAD) : at], _loads(value[at + len(PAYLOAD_AT) : -1])
            except ValueError:
                pass  # a "payload" inside the schema's text: parse the whole value below
    parsed = _loads(value)
    if isinstance(parsed, dict) and set(parsed) == {"schema", "payload"}:
        return json.dumps(parsed["schema"], separators=(",", ":")).encode(), parsed["payload"]
    return None, parsed


def source_of(value: bytes | None, events: Split = split) -> dict[str, Any] | None:
    """A change event's `source` block (the database, schema, table, when it committed, its
    position); None for a tombstone or a value that is not a change event."""
    if value is None:
        return None
    try:
        _, payload = events(value)
    except ValueError:
        return None
    source = payload.get("source") if isinstance(payload, dict) else None
    return source if isinstance(source, dict) else None


def source_ts_ms(value: bytes | None) -> int | None:
    """When the database committed the change (`source.ts_ms`), or None."""
    found = (source_of(value) or {}).get("ts_ms")
    return found if isinstance(found, int) else None


def row_columns(envelope_schema: dict[str, Any]) -> list[Column]:
    """The columns of an envelope's `after` struct (or of a key's struct)."""
    for field in envelope_schema.get("fields") or []:
        if field.get("field") == "after":
            return struct_columns(field)
    return struct_columns(envelope_schema)


def row_schema(envelope_schema: dict[str, Any]) -> dict[str, Any]:
    for field in envelope_schema.get("fields") or []:
        if field.get("field") == "after":
            return dict(field)
    return envelope_schema


def field_of(column: Column) -> StructField:
    """A row column as the table's field (nullable), its Connect default kept in the field's
    metadata (DEFAULT): the value of the rows and events that predate it."""
    from pyspark.sql.types import StructField

    metadata = {} if column.default is None else {DEFAULT: column.default}
    return StructField(column.name, column.data_type, True, metadata)


def defaults(fields: StructType) -> dict[str, Any]:
    """Each column's Connect default (field_of), as its column takes it."""
    return {
        f.name: for_spark_type(f.name, f.dataType).convert(f.metadata[DEFAULT])
        for f in fields
        if f.metadata.get(DEFAULT) is not None
    }


def evolved(fields: StructType, new_row_schema: str, table: str) -> StructType:
    """The table's columns after an event of `new_row_schema`: each column it adds, nullable,
    at the end; a column whose type it widens, widened (schema_change.widest); a column it
    lacks stays. SchemaChangeRefused for a column whose type neither holds the other's."""
    from pyspark.sql.types import StructField, StructType

    columns = {f.name: f for f in fields}
    added = []
    for column in row_columns(json.loads(new_row_schema)):
        held = columns.get(column.name)
        if held is None:
            added.append(field_of(column))
            continue
        wider = widest(held.dataType, column.data_type)
        if wider is None:
            refuse(table, column.name, held.dataType, column.data_type)
        elif wider != held.dataType:
            columns[column.name] = StructField(held.name, wider, True, held.metadata)
    return StructType([*columns.values(), *added])


class Unstorable(Exception):
    """A value its column cannot take: the event's rejection, one line."""

    def __init__(self, column: str, cause: BaseException | str) -> None:
        reason = str(cause).splitlines()[0][:200] if str(cause) else type(cause).__name__
        super().__init__(f"{UNSTORABLE}: column {column!r}: {reason}")


class Envelope:
    """Reads change events into Changes for a table of columns `fields` (the row's, then the
    mirror's own columns asked for) keyed on `key_fields`."""

    def __init__(
        self,
        fields: StructType,
        key_fields: tuple[str, ...],
        deletes: Deletes,
        change_log: bool = False,
        truncates: bool = False,
        events: Split = split,
    ) -> None:
        self.fields = fields
        self.events = events
        # Whether a TRUNCATE is applied (the tasks' change files) or rejected (Spark's rows).
        self.truncates = truncates
        self.key_fields = key_fields
        self.deletes = deletes
        # --write append: each event is a row of its own; a tombstone is none.
        self.change_log = change_log
        self.names = [f.name for f in fields if f.name not in (*CDC_COLUMNS, DELETED)]
        self.cdc = [name for name in fields.fieldNames() if name in (*CDC_COLUMNS, DELETED)]
        self._types = {f.name: f.dataType for f in fields}
        # The table's own reading of each column, for events without a schema and keys.
        self._given = {f.name: for_spark_type(f.name, f.dataType) for f in fields}
        # The value of a column an event's schema lacks: its default (none: NULL).
        self._defaults = defaults(fields)
        # By schema text: the event's columns, and the text again when the table lacks some.
        self._schemas: dict[bytes, tuple[list[Column], str | None]] = {}
        # By schema text: a Kafka key's columns.
        self._keys: dict[bytes, dict[str, Column]] = {}

    def change(self, key: bytes | None, value: bytes | None) -> Change:
        if value is None:
            if self.deletes == "soft" or self.change_log:
                return Change(skip=True)
            return self._delete(key, {})
        try:
            schema, payload = self.events(value)
        except ValueError as exc:
            return Change(error=str(exc) if isinstance(exc, Undecodable) else NOT_JSON)
        if not isinstance(payload, dict) or not isinstance(payload.get("op"), str):
            return Change(error=NOT_AN_EVENT)
        op = payload["op"]
        columns, new_schema = self.columns(schema)
        if op == "d":
            return self._delete(key, payload, columns)
        if op == "t" and self.truncates:
            return Change(skip=True, truncate=True)
        if op not in ("r", "c", "u"):
            return Change(error=OTHER_OP)
        after = payload.get("after")
        if not isinstance(after, dict):
            return Change(error=NO_AFTER)
        try:
            row = self._row(after, columns)
        except Unstorable as exc:
            return Change(error=str(exc))
        if any(row.get(name) is None for name in self.key_fields):
            return Change(error=KEY_MISSING)
        row.update(self._cdc_values(payload, deleted=False))
        return Change(row=row, new_schema=new_schema)

    def _delete(
        self, key: bytes | None, payload: dict[str, Any], columns: list[Column] | None = None
    ) -> Change:
        keyed = self._key(key)
        if keyed is None and isinstance(payload.get("before"), dict):
            keyed = self._key_before(payload["before"], columns or self.columns(None)[0])
        if keyed is None:
            # A tombstone whose key names no row of the table (a table without a primary
            # key, --key-field): the delete before it removed the row from its `before`.
            return Change(skip=True) if not payload else Change(error=KEY_MISSING)
        keyed.update(self._cdc_values(payload, deleted=True))
        return Change(row=keyed, delete=True)

    def _key(self, key: bytes | None) -> dict[str, Any] | None:
        """The key's fields from the Kafka key, as the table's columns take them: by the key's
        own schema where it carries one, else by the table's types; None when it does not
        give them all."""
        if not self.key_fields:  # a table without a key (its change log): nothing to read
            return {}
        if key is None:
            return None
        try:
            schema, payload = self.events(key)
        except ValueError:
            return None
        if not isinstance(payload, dict):
            return None
        given = self._given if schema is None else self._key_columns(schema)
        found = {}
        for name in self.key_fields:
            raw = payload.get(name)
            if raw is None or name not in self._given or name not in given:
                return None
            try:
                found[name] = given[name].convert(raw)
            except CONVERSION_ERRORS:
                return None
        return found

    def _key_columns(self, schema: bytes) -> dict[str, Column]:
        """The columns of a Kafka key's schema, by name."""
        known = self._keys.get(schema)
        if known is None:
            known = self._keys[schema] = {c.name: c for c in row_columns(json.loads(schema))}
        return known

    def _key_before(self, before: dict[str, Any], columns: list[Column]) -> dict[str, Any] | None:
        """The key's fields from a delete's `before` row, when the Kafka key does not give
        them (--key-field, or REPLICA IDENTITY FULL: `before` holds the whole row)."""
        row = self._row(before, columns)
        if any(row.get(name) is None for name in self.key_fields):
            return None
        return {name: row[name] for name in self.key_fields}

    def columns(self, schema: bytes | None) -> tuple[list[Column], str | None]:
        if schema is None:
            return [self._given[name] for name in self.names], None
        known = self._schemas.get(schema)
        if known is None:
            parsed = json.loads(schema)
            columns = row_columns(parsed)
            fits = all(
                c.name in self._types and takes(self._types[c.name], c.data_type) for c in columns
            )
            new = None if fits else json.dumps(row_schema(parsed), separators=(",", ":"))
            known = self._schemas[schema] = (columns, new)
        return known

    def as_stored(self, columns: list[Column]) -> bool:
        """An event of these columns gives each its table's type, and each column with a
        default its value: a batch's values may be read at once (cdc/columnar.py)."""
        given = {c.name for c in columns}
        return all(self._types.get(c.name) == c.data_type for c in columns) and all(
            name in given for name in self._defaults
        )

    def _row(self, after: dict[str, Any], columns: list[Column]) -> dict[str, Any]:
        row: dict[str, Any] = dict.fromkeys(self.names)
        if self._defaults:
            given = {c.name for c in columns}
            row.update((n, v) for n, v in self._defaults.items() if n not in given)
        for column in columns:
            raw = after.get(column.name)
            if raw is not None and column.name in row:
                try:
                    row[column.name] = column.convert(raw)
                except CONVERSION_ERRORS as exc:
                    raise Unstorable(column.name, exc) from None
        return row

    def _cdc_values(self, payload: dict[str, Any], deleted: bool) -> dict[str, Any]:
        if not self.cdc:
            return {}
        source = payload.get("source") or {}
        values = {
            OP: payload.get("op"),
            SOURCE_TS_MS: source.get("ts_ms"),
            LSN: source.get("lsn"),
            DELETED: deleted,
        }
        return {name: values[name] for name in self.cdc}
