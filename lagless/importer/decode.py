"""Avro values: the Confluent wire format (magic byte 0, a 4-byte schema id, then Avro binary)
with a Schema Registry, or plain Avro binary of one schema file. Decoded with fastavro in the
executors' Python workers (source/avro_values.py), a batch of records into one Arrow struct
column, against the reader schema the table's columns come from: a record written with another
registered schema is resolved to it by Avro's rules.

The columns come from the reader schema (`avro_fields`): records become structs, unions with
null nullable fields, enums strings, logical decimals, dates and timestamps their Spark types.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from lagless.exceptions import BadInput
from lagless.first_line import first_line
from lagless.source import avro_values
from lagless.source.avro_values import UNDECODABLE

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType, StructType


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
    ERROR: ClassVar[str] = avro_values.ERROR

    @property
    def reasons(self) -> tuple[str, ...]:
        if self.registry_url is None:
            return (UNDECODABLE,)
        return avro_values.REASONS

    def decode(self, records: DataFrame, column: str) -> DataFrame:
        """records with `column` (the decoded value, a struct) and ERROR added."""
        from pyspark.sql.types import StringType, StructField, StructType

        fields = avro_fields(parse_avro_schema(self.reader_schema, "the reader schema"))
        added = [StructField(column, fields), StructField(self.ERROR, StringType())]
        schema = StructType([*records.schema.fields, *added])
        return records.mapInArrow(self.values(fields.json(), column), schema)

    def values(self, fields_json: str, column: str = avro_values.COLUMN) -> avro_values.AvroValues:
        """The decoder the executors run, into `column` (a struct of the Spark schema
        `fields_json`); as the source's option decodeAvroValues: `.option()`."""
        return avro_values.AvroValues(self.reader_schema, self.registry_url, fields_json, column)


def latest_registered(registry_url: str, subject: str) -> str:
    """The newest schema of `subject` (JSON text); BadInput when there is none or no registry."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        found = _registry(registry_url).get_latest_version(subject)
    except SchemaRegistryError as exc:
        if exc.http_status_code == 404:
            raise BadInput(f"schema registry {registry_url} has no subject {subject!r}") from None
        raise BadInput(f"schema registry {registry_url}: {first_line(exc)}") from None
    except Exception as exc:
        raise _unreachable(registry_url, exc) from None
    if found.schema is None or found.schema.schema_str is None:
        raise BadInput(f"schema registry {registry_url} gave no schema for {subject!r}")
    if (found.schema.schema_type or "AVRO") != "AVRO":
        raise BadInput(f"subject {subject!r} holds a {found.schema.schema_type} schema, not Avro")
    return found.schema.schema_str


def check_registry(registry_url: str) -> None:
    """BadInput unless a Schema Registry answers at `registry_url` (its list of subjects)."""
    try:
        _registry(registry_url).get_subjects()
    except Exception as exc:
        raise _unreachable(registry_url, exc) from None


def _registry(registry_url: str) -> SchemaRegistryClient:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": registry_url, "timeout": 10})


def _unreachable(registry_url: str, exc: Exception) -> BadInput:
    return BadInput(f"cannot reach the schema registry at {registry_url}: {first_line(exc)}")
