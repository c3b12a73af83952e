"""Debezium's change events in Avro (Confluent's AvroConverter): each Avro schema as the Kafka
Connect schema it was written from, so that one mapping (connect_types.py) makes the columns of
both formats, and the schema a value is read with so that each value comes as the JSON path's
value of its Connect type (and connect_types converts it alike).

AvroConverter (Confluent's AvroData) writes a Connect schema as Avro, keeping what Avro lacks
in properties of each type: `connect.name` (the logical type: `io.debezium.time.MicroTimestamp`,
`org.apache.kafka.connect.data.Decimal`), `connect.parameters` (a decimal's scale and
precision, an enum's values), `connect.type` (int8 and int16, which Avro writes as int),
`connect.default` (the column's default, also the field's Avro `default`). So:

| Avro | Connect |
| --- | --- |
| int (`connect.type`: int8, int16), long | int8, int16, int32, int64 |
| float, double, boolean, string, bytes | float32, float64, boolean, string, bytes |
| fixed, enum | bytes, string |
| record, array, map | struct, array, map |
| array of `io.confluent.connect.avro.MapEntry` | map (keys that are not text) |
| `["null", T]` | T, optional |
| logicalType decimal, date, time-millis, timestamp-millis | Decimal, Date, Time, Timestamp |

(a logicalType without `connect.name`: a `connect.name` says it first).

Values are read with the logical types taken out (`plain`): a Decimal is its bytes, a Date its
days, a timestamp its count of units, as in JSON but for bytes, which come as bytes rather than
base64 (connect_types takes either). A default of a bytes type, which Avro's JSON writes as
text of one character per byte, becomes base64 as JsonConverter writes it.

Pure: no I/O, nothing of lagless but its errors.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from lagless.exceptions import BadInput

_PRIMITIVES = {
    "int": "int32",
    "long": "int64",
    "float": "float32",
    "double": "float64",
    "boolean": "boolean",
    "string": "string",
    "bytes": "bytes",
    "fixed": "bytes",
    "enum": "string",
}
# Avro's logical types a schema may carry without `connect.name` (AvroData reads them so).
_LOGICAL = {
    "decimal": "org.apache.kafka.connect.data.Decimal",
    "date": "org.apache.kafka.connect.data.Date",
    "time-millis": "org.apache.kafka.connect.data.Time",
    "timestamp-millis": "org.apache.kafka.connect.data.Timestamp",
    "time-micros": "io.debezium.time.MicroTime",
    "timestamp-micros": "io.debezium.time.MicroTimestamp",
}
MAP_ENTRY = "io.confluent.connect.avro.MapEntry"


def connect_schema(avro: Any) -> dict[str, Any]:
    """The Connect schema (as Kafka Connect's JsonConverter writes it) of an Avro schema as
    AvroConverter writes one (JSON, parsed). BadInput for what no Connect schema writes (a
    union of two types, a recursive record)."""
    import fastavro

    try:
        expanded = fastavro.parse_schema(avro, expand=True, _write_hint=False)
    except Exception as exc:  # fastavro's SchemaParseException and its kin
        raise BadInput(f"Avro schema cannot be read: {str(exc)[:200]}") from None
    return _connect(expanded, depth=0)


def _connect(avro: Any, depth: int) -> dict[str, Any]:
    if depth > 64:
        raise BadInput("Avro schema nests deeper than 64 levels (a recursive record?)")
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        if len(branches) != 1:
            raise BadInput(f"Avro union {json.dumps(avro)[:200]} is no Connect type")
        return {**_connect(branches[0], depth + 1), "optional": True}
    if isinstance(avro, str):
        avro = {"type": avro}
    kind = avro["type"]
    if isinstance(kind, dict | list):
        return _connect(kind, depth + 1)
    schema: dict[str, Any] = {"optional": False}
    if kind == "record":
        schema["type"] = "struct"
        schema["fields"] = [_field(f, depth) for f in avro["fields"]]
    elif kind == "array" and _map_entry(avro["items"]) is not None:
        key, value = _map_entry(avro["items"])  # type: ignore[misc]
        schema.update(type="map", keys=_connect(key, depth + 1), values=_connect(value, depth + 1))
    elif kind == "array":
        schema.update(type="array", items=_connect(avro["items"], depth + 1))
    elif kind == "map":
        values = _connect(avro["values"], depth + 1)
        schema.update(type="map", keys={"type": "string", "optional": False}, values=values)
    elif kind in _PRIMITIVES:
        schema["type"] = avro.get("connect.type") or _PRIMITIVES[kind]
    else:
        raise BadInput(f"Avro type {json.dumps(avro)[:200]} is no Connect type")
    return _named(avro, schema)


def _named(avro: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The Connect metadata AvroConverter keeps in properties: the logical name, its
    parameters, the version."""
    name = avro.get("connect.name") or _LOGICAL.get(avro.get("logicalType", ""))
    if name is not None:
        schema["name"] = name
    parameters = avro.get("connect.parameters")
    if parameters is None and name == _LOGICAL["decimal"] and "scale" in avro:
        parameters = {"scale": str(avro["scale"])}
        if "precision" in avro:
            parameters["connect.decimal.precision"] = str(avro["precision"])
    if parameters is not None:
        schema["parameters"] = {str(k): str(v) for k, v in parameters.items()}
    if "connect.version" in avro:
        schema["version"] = avro["connect.version"]
    return schema


def _map_entry(items: Any) -> tuple[Any, Any] | None:
    """(key, value) schemas of AvroData's entry of a map whose keys are not strings."""
    named = isinstance(items, dict) and MAP_ENTRY in (items.get("name"), items.get("connect.name"))
    if named and items.get("type") == "record":
        fields = {f["name"]: f["type"] for f in items["fields"]}
        if set(fields) == {"key", "value"}:
            return fields["key"], fields["value"]
    return None


def _field(field: dict[str, Any], depth: int) -> dict[str, Any]:
    """A record's field as a Connect struct's, its default as JsonConverter writes it."""
    schema = _connect(field["type"], depth + 1)
    default = _default(field)
    if default is not None:
        if schema["type"] == "bytes" and isinstance(default, str):
            default = base64.b64encode(default.encode("latin-1")).decode()
        schema["default"] = default
    return {**schema, "field": field["name"]}


def _default(field: dict[str, Any]) -> Any:
    """The field's Connect default: its type's `connect.default`, else its Avro default."""
    kind = field["type"]
    for branch in kind if isinstance(kind, list) else [kind]:
        if isinstance(branch, dict) and branch.get("connect.default") is not None:
            return branch["connect.default"]
    return field.get("default")


def plain(avro: Any) -> Any:
    """The Avro schema (JSON, parsed) without its logical types: each value read as its
    Connect type's value in JSON (a Decimal's bytes, a Date's days, a Timestamp's ms)."""
    if isinstance(avro, list):
        return [plain(each) for each in avro]
    if isinstance(avro, dict):
        return {k: plain(v) for k, v in avro.items() if k != "logicalType"}
    return avro
