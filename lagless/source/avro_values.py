"""Avro values decoded with fastavro, a batch of records at a time, into one Arrow struct column
and the reason a value does not decode: in the executors' Python workers, either in a Spark job
over the batch's rows (importer/decode.py's AvroDecoding.decode) or in the source's own tasks
(option decodeAvroValues: their writer then writes the rows itself, sinks/staged_parquet.py).

The Confluent wire format (magic byte 0, a 4-byte schema id, then Avro binary) with a Schema
Registry, or plain Avro binary of one schema file; a record written with another registered
schema is resolved to the reader schema by Avro's rules.

Runs on executors: imports nothing of lagless but its errors.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Iterator
from typing import Any, ClassVar

import pyarrow as pa

from lagless.exceptions import TransientError
from lagless.first_line import first_line

NOT_CONFLUENT = "value is not in the Confluent Avro wire format (magic byte 0, schema id)"
UNKNOWN_SCHEMA_ID = "value's schema id is not in the schema registry"
UNDECODABLE = "value does not decode with its Avro schema"
# Why a value in the wire format is not decoded, in the order they are found.
REASONS = (NOT_CONFLUENT, UNKNOWN_SCHEMA_ID, UNDECODABLE)
# The column the source's tasks add the decoded values in (decodeAvroValues), and the column
# of the reason a value does not decode (NULL where it does).
COLUMN = "_lagless_avro"
ERROR = "_lagless_avro_error"
_MAGIC = 0
_HEADER = struct.Struct(">bI")
WIRE_HEADER = _HEADER.size


class AvroValues:
    """Adds the decoded values (`column`, a struct of the Spark schema `fields_json`) and ERROR
    to batches of records: against `reader_schema` (JSON text), the writer schema found by
    schema id in the registry at `registry_url`, or the reader schema itself."""

    def __init__(
        self,
        reader_schema: str,
        registry_url: str | None,
        fields_json: str,
        column: str = COLUMN,
    ) -> None:
        self.reader_schema = reader_schema
        self.registry_url = registry_url
        self.fields_json = fields_json
        self.column = column

    @classmethod
    def from_option(cls, option: str) -> AvroValues:
        """From decodeAvroValues (`option`)."""
        given = json.loads(option)
        return cls(given["reader_schema"], given.get("registry_url"), given["fields"])

    def option(self) -> str:
        """As decodeAvroValues takes it."""
        return json.dumps(
            {
                "reader_schema": self.reader_schema,
                "registry_url": self.registry_url,
                "fields": self.fields_json,
            }
        )

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import fastavro
        from pyspark.sql.pandas.types import to_arrow_type
        from pyspark.sql.types import StructType

        reader: dict[str, Any] = fastavro.parse_schema(json.loads(self.reader_schema))  # type: ignore[assignment]
        arrow_type = to_arrow_type(StructType.fromJson(json.loads(self.fields_json)))
        writers = WriterSchemas(self.registry_url)
        for batch in batches:
            decoded: list[dict[str, Any] | None] = []
            errors: list[str | None] = []
            for value in batch.column("value").to_pylist():
                record, error = None, None
                if value is not None:
                    record, error = _decode_one(value, reader, writers)
                decoded.append(record)
                errors.append(error)
            yield pa.RecordBatch.from_arrays(
                [*batch.columns, pa.array(decoded, arrow_type), pa.array(errors, pa.string())],
                names=[*batch.schema.names, self.column, ERROR],
            )


def _decode_one(
    value: bytes, reader: dict[str, Any], writers: WriterSchemas
) -> tuple[dict[str, Any] | None, str | None]:
    import fastavro

    body = io.BytesIO(value)
    writer = reader
    if writers.registry_url is not None:
        schema_id = wire_schema_id(value)
        if schema_id is None:
            return None, NOT_CONFLUENT
        writer_or_none = writers.get(schema_id)
        if writer_or_none is None:
            return None, UNKNOWN_SCHEMA_ID
        writer = writer_or_none
        body.seek(WIRE_HEADER)
    try:
        record = fastavro.schemaless_reader(body, writer, reader)
    except Exception:
        return None, UNDECODABLE
    if body.tell() != len(value):  # bytes left over: not a value of this schema
        return None, UNDECODABLE
    return record, None  # type: ignore[return-value]


def wire_schema_id(value: bytes) -> int | None:
    """The schema id of a value in Confluent's wire format (its Avro binary follows from
    WIRE_HEADER); None when the value is not in that format."""
    if len(value) < _HEADER.size or value[0] != _MAGIC:
        return None
    return int(_HEADER.unpack_from(value)[1])


class WriterSchemas:
    """Writer schemas by id, fetched once per Python worker and id: as the registry holds them
    (`text`), and parsed by fastavro (`get`)."""

    _texts: ClassVar[dict[tuple[str, int], str | None]] = {}
    _parsed: ClassVar[dict[tuple[str, int], dict[str, Any] | None]] = {}

    def __init__(self, registry_url: str | None) -> None:
        self.registry_url = registry_url

    def get(self, schema_id: int) -> dict[str, Any] | None:
        """The writer schema of `schema_id`, parsed; None when the registry has none."""
        import fastavro

        assert self.registry_url is not None
        cached = (self.registry_url, schema_id)
        if cached not in self._parsed:
            text = self.text(schema_id)
            parsed = None if text is None else fastavro.parse_schema(json.loads(text))
            self._parsed[cached] = parsed  # type: ignore[assignment]
        return self._parsed[cached]

    def text(self, schema_id: int) -> str | None:
        """The writer schema of `schema_id` as the registry holds it; None when it has none.
        TransientError when the registry does not answer."""
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        assert self.registry_url is not None
        cached = (self.registry_url, schema_id)
        if cached not in self._texts:
            client = SchemaRegistryClient({"url": self.registry_url})
            try:
                self._texts[cached] = client.get_schema(schema_id).schema_str or "null"
            except SchemaRegistryError as exc:
                if exc.http_status_code != 404:
                    raise TransientError(f"schema registry: {first_line(exc)}") from None
                self._texts[cached] = None
            except Exception as exc:
                raise TransientError(
                    f"cannot reach the schema registry at {self.registry_url}: {first_line(exc)}"
                ) from None
        return self._texts[cached]
