"""Avro values: the Confluent wire format (magic byte 0, a 4-byte schema id, then Avro binary)
with a Schema Registry, or plain Avro binary of one schema file. Decoded with fastavro in the
executors' Python workers, a batch of records into one Arrow struct column (Spark's
mapInArrow), against the reader schema the table's columns come from: a record written with
another registered schema is resolved to it by Avro's rules.

The columns come from the reader schema (`avro_fields`): records become structs, unions with
null nullable fields, enums strings, logical decimals, dates and timestamps their Spark types.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from lagless.exceptions import BadInput, TransientError
from lagless.first_line import first_line

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType, StructType

NOT_CONFLUENT = "value is not in the Confluent Avro wire format (magic byte 0, schema id)"
UNKNOWN_SCHEMA_ID = "value's schema id is not in the schema registry"
UNDECODABLE = "value does not decode with its Avro schema"
_MAGIC = 0
_HEADER = struct.Struct(">bI")


def parse_avro_schema(text: str, where: str) -> dict[str, Any]:
    import fastavro

    try:
        parsed = fastavro.parse_schema(json.loads(text))
    except Exception as exc:
        raise BadInput(f"{where} is not an Avro schema: {first_line(exc)}") from None
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        raise BadInput(f"{where} is not an Avro record schema")
    return parsed


def avro_fields(schema: dict[str, Any]) -> StructType:
    """The Spark columns of an Avro record schema (fastavro-parsed)."""
    from pyspark.sql.types import StructType

    fields = _spark_type(schema, {})
    assert isinstance(fields, StructType)
    return fields


def _spark_type(schema: Any, named: dict[str, Any]) -> DataType:
    from pyspark.sql import types as T

    if isinstance(schema, list):
        branches = [s for s in schema if s != "null"]
        if len(branches) != 1:
            raise BadInput(f"Avro union {json.dumps(schema)} has several non-null branches")
        return _spark_type(branches[0], named)
    if isinstance(schema, str):
        primitive = {
            "boolean": T.BooleanType(),
            "int": T.IntegerType(),
            "long": T.LongType(),
            "float": T.FloatType(),
            "double": T.DoubleType(),
            "bytes": T.BinaryType(),
            "string": T.StringType(),
        }
        if schema in primitive:
            return primitive[schema]
        if schema in named:
            if named[schema] is None:
                raise BadInput(f"Avro record {schema!r} is recursive")
            return _spark_type(named[schema], named)
        raise BadInput(f"Avro type {schema!r} is not supported")
    logical = schema.get("logicalType")
    kind = schema["type"]
    if logical == "decimal":
        return T.DecimalType(schema["precision"], schema.get("scale", 0))
    if logical == "date":
        return T.DateType()
    if logical in ("timestamp-millis", "timestamp-micros"):
        return T.TimestampType()
    if logical in ("local-timestamp-millis", "local-timestamp-micros"):
        return T.TimestampNTZType()
    if kind == "record":
        named[schema["name"]] = None  # being defined: a reference to it now is recursion
        fields = T.StructType(
            [
                T.StructField(f["name"], _spark_type(f["type"], named), _nullable(f["type"]))
                for f in schema["fields"]
            ]
        )
        named[schema["name"]] = schema
        return fields
    if kind == "enum":
        named[schema["name"]] = schema
        return T.StringType()
    if kind == "fixed":
        named[schema["name"]] = schema
        return T.BinaryType()
    if kind == "array":
        return T.ArrayType(_spark_type(schema["items"], named), _nullable(schema["items"]))
    if kind == "map":
        values = schema["values"]
        return T.MapType(T.StringType(), _spark_type(values, named), _nullable(values))
    return _spark_type(kind, named)


def _nullable(schema: Any) -> bool:
    return isinstance(schema, list) and "null" in schema


@dataclass(frozen=True)
class AvroDecoding:
    """How the executors decode values: against `reader_schema` (JSON text), the writer schema
    found by schema id in the registry at `registry_url`, or the reader schema itself."""

    reader_schema: str
    registry_url: str | None = None
    # The column holding the reason a value does not decode (one of `reasons`), else NULL.
    ERROR: ClassVar[str] = "_lagless_avro_error"

    @property
    def reasons(self) -> tuple[str, ...]:
        if self.registry_url is None:
            return (UNDECODABLE,)
        return (NOT_CONFLUENT, UNKNOWN_SCHEMA_ID, UNDECODABLE)

    def decode(self, records: DataFrame, column: str) -> DataFrame:
        """records with `column` (the decoded value, a struct) and ERROR added."""
        from pyspark.sql.types import StringType, StructField, StructType

        fields = avro_fields(parse_avro_schema(self.reader_schema, "the reader schema"))
        added = [StructField(column, fields), StructField(self.ERROR, StringType())]
        schema = StructType([*records.schema.fields, *added])
        return records.mapInArrow(_Decoder(self, fields.json(), column), schema)


class _Decoder:
    """The function mapInArrow runs in the executors (pickled with its settings)."""

    def __init__(self, decoding: AvroDecoding, fields_json: str, column: str) -> None:
        self.decoding = decoding
        self.fields_json = fields_json
        self.column = column

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import fastavro
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_type
        from pyspark.sql.types import StructType

        reader: dict[str, Any] = fastavro.parse_schema(json.loads(self.decoding.reader_schema))  # type: ignore[assignment]
        arrow_type = to_arrow_type(StructType.fromJson(json.loads(self.fields_json)))
        writers = _WriterSchemas(self.decoding.registry_url)
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
                names=[*batch.schema.names, self.column, AvroDecoding.ERROR],
            )


def _decode_one(
    value: bytes, reader: dict[str, Any], writers: _WriterSchemas
) -> tuple[dict[str, Any] | None, str | None]:
    import fastavro

    body = io.BytesIO(value)
    writer = reader
    if writers.registry_url is not None:
        if len(value) < _HEADER.size or value[0] != _MAGIC:
            return None, NOT_CONFLUENT
        writer_or_none = writers.get(_HEADER.unpack_from(value)[1])
        if writer_or_none is None:
            return None, UNKNOWN_SCHEMA_ID
        writer = writer_or_none
        body.seek(_HEADER.size)
    try:
        record = fastavro.schemaless_reader(body, writer, reader)
    except Exception:
        return None, UNDECODABLE
    if body.tell() != len(value):  # bytes left over: not a value of this schema
        return None, UNDECODABLE
    return record, None  # type: ignore[return-value]


class _WriterSchemas:
    """Writer schemas by id, fetched once per Python worker and id."""

    _cache: ClassVar[dict[tuple[str, int], dict[str, Any] | None]] = {}

    def __init__(self, registry_url: str | None) -> None:
        self.registry_url = registry_url

    def get(self, schema_id: int) -> dict[str, Any] | None:
        import fastavro
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        assert self.registry_url is not None
        cached = (self.registry_url, schema_id)
        if cached not in self._cache:
            client = SchemaRegistryClient({"url": self.registry_url})
            try:
                text = client.get_schema(schema_id).schema_str
            except SchemaRegistryError as exc:
                if exc.http_status_code != 404:
                    raise TransientError(f"schema registry: {first_line(exc)}") from None
                self._cache[cached] = None
            except Exception as exc:
                raise TransientError(
                    f"cannot reach the schema registry at {self.registry_url}: {first_line(exc)}"
                ) from None
            else:
                self._cache[cached] = fastavro.parse_schema(json.loads(text or "null"))  # type: ignore[assignment]
        return self._cache[cached]


def latest_registered(registry_url: str, subject: str) -> str:
    """The newest schema of `subject` (JSON text); BadInput when there is none or no registry."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    client = SchemaRegistryClient({"url": registry_url, "timeout": 10})
    try:
        found = client.get_latest_version(subject)
    except SchemaRegistryError as exc:
        if exc.http_status_code == 404:
            raise BadInput(f"schema registry {registry_url} has no subject {subject!r}") from None
        raise BadInput(f"schema registry {registry_url}: {first_line(exc)}") from None
    except Exception as exc:
        raise BadInput(
            f"cannot reach the schema registry at {registry_url}: {first_line(exc)}"
        ) from None
    if found.schema is None or found.schema.schema_str is None:
        raise BadInput(f"schema registry {registry_url} gave no schema for {subject!r}")
    if (found.schema.schema_type or "AVRO") != "AVRO":
        raise BadInput(f"subject {subject!r} holds a {found.schema.schema_type} schema, not Avro")
    return found.schema.schema_str
