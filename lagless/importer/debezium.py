"""`--value-format debezium`: a mirror's columns and key, found before anything is written, and
the decoding of a batch's change events in the executors (the rules: lagless/cdc/envelope.py).

The columns come from the newest change event's schema (Kafka Connect's JSON embeds it; Avro's
is the registry's, `AvroEvents`), or from `--value-schema` when the events carry none; the key
is the Kafka key's fields (or `--key-field`). A batch whose events bring a column the table
lacks is written again after the column is added (batch_writer.py: `SchemaChanged`)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from lagless.cdc import columnar, key_change
from lagless.cdc.avro_schema import connect_schema, plain
from lagless.cdc.envelope import (
    CDC_COLUMNS,
    CDC_TYPES,
    DELETE_COLUMN,
    DELETED,
    ERROR_COLUMN,
    NEW_SCHEMA_COLUMN,
    SKIP_COLUMN,
    Deletes,
    Envelope,
    Split,
    Undecodable,
    field_of,
    row_columns,
    split,
)
from lagless.cdc.unavailable import kept_columns, placed
from lagless.exceptions import BadInput
from lagless.source.avro_values import (
    NOT_CONFLUENT,
    UNDECODABLE,
    UNKNOWN_SCHEMA_ID,
    WIRE_HEADER,
    WriterSchemas,
    wire_schema_id,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType, StructType

    from lagless.kafka.offset_reader import OffsetReader
    from lagless.sinks.base import Target

log = logging.getLogger(__name__)

# Records read from each partition's end to find the newest change event with a schema.
NEWEST_RECORDS = 20


class AvroEvents:
    """Change events (keys and values) in Avro through the registry at `registry_url`, in
    Confluent's wire format as its AvroConverter writes them, read as envelope.split reads
    Kafka Connect's JSON: (the Connect schema's text, the payload), the payload's values as
    the JSON's (cdc/avro_schema.py). Undecodable with the wire format's reasons."""

    # By registry and schema id: the Connect schema's text and the schema values are read
    # with, made once per Python worker.
    _schemas: ClassVar[dict[tuple[str, int], tuple[bytes, Any] | None]] = {}

    def __init__(self, registry_url: str) -> None:
        self.registry_url = registry_url
        self.writers = WriterSchemas(registry_url)

    def __call__(self, data: bytes) -> tuple[bytes | None, Any]:
        import fastavro

        schema_id = wire_schema_id(data)
        if schema_id is None:
            raise Undecodable(NOT_CONFLUENT)
        known = self._schema(schema_id)
        if known is None:
            raise Undecodable(UNKNOWN_SCHEMA_ID)
        connect, reader = known
        body = io.BytesIO(data)
        body.seek(WIRE_HEADER)
        try:
            payload = fastavro.schemaless_reader(body, reader, None)
        except Exception:
            raise Undecodable(UNDECODABLE) from None
        if body.tell() != len(data):  # bytes left over: not a value of this schema
            raise Undecodable(UNDECODABLE)
        return connect, payload

    def _schema(self, schema_id: int) -> tuple[bytes, Any] | None:
        import fastavro

        cached = (self.registry_url, schema_id)
        if cached not in self._schemas:
            text = self.writers.text(schema_id)
            if text is None:
                self._schemas[cached] = None
            else:
                avro = json.loads(text)
                connect = json.dumps(connect_schema(avro), separators=(",", ":")).encode()
                self._schemas[cached] = (connect, fastavro.parse_schema(plain(avro)))
        return self._schemas[cached]


def events_of(schema_registry: str | None) -> Split:
    """How a mirror reads its change events: Avro through `schema_registry`, else Kafka
    Connect's JSON."""
    return split if schema_registry is None else AvroEvents(schema_registry)


class SchemaChanged(Exception):
    """A batch brought row schemas the table's columns do not take: raised before its commit,
    so nothing of it is written; the import evolves the table and writes the batch again."""

    def __init__(self, schemas: list[str]) -> None:
        super().__init__(f"{len(schemas)} new row schemas")
        self.schemas = schemas


def mirror_columns(
    reader: OffsetReader,
    partitions: list[tuple[str, int]],
    given: StructType | None,
    key_fields: tuple[str, ...],
    cdc_columns: bool,
    deletes: Deletes,
    events: Split = split,
) -> tuple[StructType, tuple[str, ...]]:
    """The table's columns (the row's, then the mirror's own asked for) and its key.

    From the newest change events of the topics: the row's columns from the newest schema
    (unless `given`, --value-schema), the key from the Kafka key's fields (unless
    `key_fields`, --key-field). BadInput when the topics hold no event to read them from.
    A table without a primary key (its events have no Kafka key) has no key: (), and the
    mirror's own columns, as its change log keeps them (value_schema.py)."""
    from pyspark.sql.types import StructField, StructType

    newest = _newest_events(reader, partitions, events)
    fields = given
    if fields is None:
        with_schema = [(key, s) for key, s, _ in newest if s is not None]
        if not with_schema and isinstance(events, AvroEvents):
            raise BadInput(
                "--value-format debezium found no Avro change event of the schema registry in "
                "the topics (Kafka Connect's JSON? leave out --schema-registry)"
            )
        if not with_schema:
            raise BadInput(
                "--value-format debezium found no change event with its schema in the topics "
                "(Kafka Connect's JSON with schemas.enable=false? give --value-schema; Avro? "
                "give --schema-registry)"
            )
        columns = row_columns(json.loads(with_schema[0][1]))
        fields = StructType([field_of(c) for c in columns])
    if not key_fields:
        key_fields = _key_fields(newest, events)
        cdc_columns = cdc_columns or not key_fields
    for name in key_fields:
        if name not in fields.fieldNames():
            raise BadInput(f"key field {name!r} is not a column of the change events' rows")
    own = [*(CDC_COLUMNS if cdc_columns else ()), *((DELETED,) if deletes == "soft" else ())]
    marked = key_fields and kept_columns(fields, key_fields)
    for name in [*own, *(key_change.MARK_COLUMNS if marked else ())]:
        if name in fields.fieldNames():
            raise BadInput(f"the rows have a column {name!r}, which the mirror adds itself")
    return StructType(
        [*fields.fields, *(StructField(n, CDC_TYPES[n](), True) for n in own)]
    ), key_fields


def _newest_events(
    reader: OffsetReader, partitions: list[tuple[str, int]], events: Split
) -> list[tuple[bytes | None, str | None, float]]:
    """(key, row schema text or None, timestamp) of each partition's newest change events,
    newest first; tombstones and values `events` does not read left out."""
    low, high = reader.log.watermarks(partitions)
    starts = {tp: max(low[tp], high[tp] - NEWEST_RECORDS) for tp in partitions if high[tp] > 0}
    counts = {tp: high[tp] - start for tp, start in starts.items()}
    found = []
    for records in reader.records.at(starts, counts, timeout_s=5.0).values():
        for record in records:
            if record.value is None:
                continue
            try:
                schema, payload = events(record.value)
            except ValueError:
                continue
            if isinstance(payload, dict) and "op" in payload:
                found.append((record.key, schema, record.timestamp_s or 0.0))
    found.sort(key=lambda each: each[2], reverse=True)
    return [(key, schema.decode() if schema else None, at) for key, schema, at in found]


def _key_fields(
    newest: list[tuple[bytes | None, str | None, float]], events: Split
) -> tuple[str, ...]:
    for key, _, _ in newest:
        if key is None:
            continue
        try:
            schema, payload = events(key)
        except ValueError:
            continue
        if schema is not None:
            return tuple(c.name for c in row_columns(json.loads(schema)))
        if isinstance(payload, dict) and payload:
            return tuple(payload)
    return ()  # no Kafka key: a table without a primary key


def tell_columns_gone(where: str, table_columns: list[str], stored: list[str]) -> None:
    """A warning, in one line, of the mirror's columns its change events no longer bring
    (`stored`: the columns a batch writes): renamed or dropped upstream, they stay, NULL (or
    their default) in the rows changed from now on; the way to refill them is a re-snapshot."""
    gone = [name for name in table_columns if name not in stored]
    if gone:
        log.warning(
            "%s: columns %s are no longer in the change events (renamed or dropped upstream): "
            "kept, NULL in the rows changed from now on; to refill them, re-snapshot the table "
            "(docs/mirror.md, Schema changes)",
            where,
            gone,
        )


class DebeziumValues:
    """mapInArrow over a batch's records: the row each change event upserts or deletes, as a
    struct of the target's fields, and the decoding's columns beside it (ERROR_COLUMN,
    DELETE_COLUMN, SKIP_COLUMN, NEW_SCHEMA_COLUMN: cdc/envelope.py)."""

    def __init__(
        self,
        fields_json: str,
        key_fields: tuple[str, ...],
        deletes: Deletes,
        column: str,
        change_log: bool = False,
        schema_registry: str | None = None,
    ) -> None:
        self.fields_json = fields_json
        self.key_fields = key_fields
        self.deletes = deletes
        self.column = column
        self.change_log = change_log
        self.schema_registry = schema_registry

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark.sql.pandas.types import to_arrow_type
        from pyspark.sql.types import StructType

        fields = StructType.fromJson(json.loads(self.fields_json))
        events = events_of(self.schema_registry)
        envelope = Envelope(fields, self.key_fields, self.deletes, self.change_log, events=events)
        row_type = to_arrow_type(fields, timezone="UTC")
        kept = [] if self.change_log else kept_columns(fields, self.key_fields)
        for batch in batches:
            keys = batch.column("key").to_pylist()
            values = batch.column("value").to_pylist()
            changes = [envelope.change(k, v) for k, v in zip(keys, values, strict=True)]
            decoded = columnar.of_changes(changes, row_type)
            added = {
                self.column: decoded.rows,
                ERROR_COLUMN: decoded.error,
                DELETE_COLUMN: decoded.delete,
                SKIP_COLUMN: decoded.skip,
                NEW_SCHEMA_COLUMN: decoded.new_schema,
            }
            if kept:
                added |= _key_changes(batch, decoded.rows, kept, self.column, events)
            yield _with_columns(batch, added)


def _key_changes(
    batch: pa.RecordBatch,
    rows: pa.StructArray,
    kept: list[tuple[str, DataType]],
    column: str,
    events: Split,
) -> dict[str, pa.Array]:
    """MOVES and TAKES of a batch's records (cdc/key_change.py), and the placeholder in each
    kept column of a delete that begins a key change (the row's values, which the driver's
    rows and the store find); change_files.py's `_key_changes` on Spark's rows."""
    headers = batch.column("headers") if "headers" in batch.schema.names else None
    found = key_change.of_records(batch.column("key"), batch.column("value"), headers, events)
    nothing = pa.nulls(batch.num_rows, pa.string())
    if found is None:
        return {key_change.MOVES: nothing, key_change.TAKES: nothing}
    moves, takes = found
    begins = pc.is_valid(moves)
    children = {f.name: rows.field(i) for i, f in enumerate(rows.type)}
    for name, data_type in kept:
        children[name] = placed(children[name], data_type, begins)
    placed_rows = pa.StructArray.from_arrays(
        list(children.values()), fields=list(rows.type), mask=pc.invert(rows.is_valid())
    )
    return {column: placed_rows, key_change.MOVES: moves, key_change.TAKES: takes}


def _with_columns(batch: pa.RecordBatch, added: dict[str, pa.Array]) -> pa.RecordBatch:
    arrays = [*batch.columns, *added.values()]
    return pa.RecordBatch.from_arrays(arrays, names=[*batch.schema.names, *added])


def decode(records: DataFrame, target: Target, column: str) -> DataFrame:
    """records with `column` (the row, a struct of the target's fields), ERROR_COLUMN,
    DELETE_COLUMN, SKIP_COLUMN and NEW_SCHEMA_COLUMN added, decoded in the executors' Python
    workers."""
    from pyspark.sql.types import BooleanType, StringType, StructField, StructType

    assert target.fields is not None
    added = [
        StructField(column, target.fields),
        StructField(ERROR_COLUMN, StringType()),
        StructField(DELETE_COLUMN, BooleanType()),
        StructField(SKIP_COLUMN, BooleanType()),
        StructField(NEW_SCHEMA_COLUMN, StringType()),
    ]
    if target.marks:
        added += [StructField(n, StringType()) for n in (key_change.MOVES, key_change.TAKES)]
    values = DebeziumValues(
        target.fields.json(),
        target.key_fields,
        target.deletes,
        column,
        change_log=target.mode == "append",
        schema_registry=target.schema_registry,
    )
    return records.mapInArrow(values, StructType([*records.schema.fields, *added]))
