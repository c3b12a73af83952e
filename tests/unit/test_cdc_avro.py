"""Avro change events (lagless/cdc/avro_schema.py, importer/debezium.py's AvroEvents) read by the
same rules as Kafka Connect's JSON: each Avro schema as AvroConverter writes it gives the
columns its JSON twin (as JsonConverter writes the same Connect schema) gives, and each event
the same change, through a registry (tests/harness/schema_registry.py, a local HTTP server).

The schemas are written as Debezium 3.6 wrote them through Confluent's AvroConverter 7.0
(tests/integration/test_mirror_avro.py produces them for real)."""

from __future__ import annotations

import base64
import decimal
import io
import json
import math
import struct
from collections.abc import Iterator
from typing import Any

import fastavro
import pytest
from pyspark.sql import types as T

from lagless.cdc.avro_schema import connect_schema, plain
from lagless.cdc.connect_types import UNAVAILABLE, UNAVAILABLE_BYTES
from lagless.cdc.envelope import UNSTORABLE, Change, Envelope, field_of, row_columns, split
from lagless.exceptions import BadInput
from lagless.importer.debezium import AvroEvents
from lagless.importer.routing import envelope_source
from lagless.source.avro_values import NOT_CONFLUENT, UNDECODABLE, UNKNOWN_SCHEMA_ID
from tests.harness.schema_registry import SchemaRegistry

DECIMAL = "org.apache.kafka.connect.data.Decimal"
# (JsonConverter's field, AvroConverter's field) of each column.
COLUMNS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"type": "int32", "optional": False}, {"type": "int"}),
    (
        {"type": "int16", "optional": True},
        {"type": ["null", {"type": "int", "connect.type": "int16"}]},
    ),
    (
        {
            "type": "bytes",
            "optional": True,
            "name": DECIMAL,
            "version": 1,
            "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        },
        {
            "type": [
                "null",
                {
                    "type": "bytes",
                    "scale": 2,
                    "precision": 10,
                    "connect.version": 1,
                    "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
                    "connect.name": DECIMAL,
                    "logicalType": "decimal",
                },
            ]
        },
    ),
    ({"type": "float", "optional": True}, {"type": ["null", "float"]}),
    (
        {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp"},
        {"type": ["null", {"type": "long", "connect.name": "io.debezium.time.MicroTimestamp"}]},
    ),
    (
        {"type": "int32", "optional": True, "name": "io.debezium.time.Date"},
        {"type": ["null", {"type": "int", "connect.name": "io.debezium.time.Date"}]},
    ),
    (
        {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp"},
        {"type": ["null", {"type": "string", "connect.name": "io.debezium.time.ZonedTimestamp"}]},
    ),
    (
        {"type": "string", "optional": True, "name": "io.debezium.data.Json"},
        {"type": ["null", {"type": "string", "connect.name": "io.debezium.data.Json"}]},
    ),
    ({"type": "bytes", "optional": True}, {"type": ["null", "bytes"]}),
    (
        {"type": "array", "items": {"type": "string", "optional": True}, "optional": True},
        {"type": ["null", {"type": "array", "items": ["null", "string"]}]},
    ),
    (
        {
            "type": "map",
            "keys": {"type": "string", "optional": False},
            "values": {"type": "string", "optional": True},
            "optional": True,
        },
        {"type": ["null", {"type": "map", "values": ["null", "string"]}]},
    ),
    (
        {
            "type": "struct",
            "fields": [
                {"type": "int32", "optional": False, "field": "scale"},
                {"type": "bytes", "optional": False, "field": "value"},
            ],
            "optional": True,
            "name": "io.debezium.data.VariableScaleDecimal",
        },
        {
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "VariableScaleDecimal",
                    "namespace": "io.debezium.data",
                    "fields": [
                        {"name": "scale", "type": "int"},
                        {"name": "value", "type": "bytes"},
                    ],
                    "connect.name": "io.debezium.data.VariableScaleDecimal",
                },
            ]
        },
    ),
    (
        {"type": "int32", "optional": True, "default": 7},
        {"type": [{"type": "int", "connect.default": 7}, "null"], "default": 7},
    ),
    (
        {
            "type": "bytes",
            "optional": True,
            "name": DECIMAL,
            "parameters": {"scale": "1", "connect.decimal.precision": "5"},
            "default": "GQ==",  # 2.5
        },
        {
            "type": [
                {
                    "type": "bytes",
                    "scale": 1,
                    "precision": 5,
                    "connect.parameters": {"scale": "1", "connect.decimal.precision": "5"},
                    "connect.default": "\u0019",
                    "connect.name": DECIMAL,
                    "logicalType": "decimal",
                },
                "null",
            ],
            "default": "\u0019",
        },
    ),
]
NAMES = ["id", "small", "price", "f", "ts", "d", "tz", "js", "by", "tags", "hs", "vsd", "z", "dd"]
DEFAULTED = ("z", "dd")


def json_row_schema(names: list[str]) -> list[dict[str, Any]]:
    return [{**COLUMNS[NAMES.index(n)][0], "field": n} for n in names]


def avro_row_schema(names: list[str]) -> dict[str, Any]:
    fields = [{"name": n, **COLUMNS[NAMES.index(n)][1]} for n in names]
    return {
        "type": "record",
        "name": "Value",
        "fields": fields,
        "connect.name": "db.public.t.Value",
    }


def json_envelope(names: list[str]) -> dict[str, Any]:
    row = {"type": "struct", "fields": json_row_schema(names), "optional": True}
    source = [
        {"type": "int64", "optional": False, "field": "ts_ms"},
        {"type": "int64", "optional": True, "field": "lsn"},
        {"type": "string", "optional": False, "field": "schema"},
        {"type": "string", "optional": False, "field": "table"},
    ]
    return {
        "type": "struct",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            {"type": "struct", "fields": source, "optional": False, "field": "source"},
            {"type": "string", "optional": False, "field": "op"},
        ],
        "optional": False,
        "name": "db.public.t.Envelope",
    }


def avro_envelope(names: list[str]) -> dict[str, Any]:
    source = {
        "type": "record",
        "name": "Source",
        "namespace": "io.debezium.connector.postgresql",
        "fields": [
            {"name": "ts_ms", "type": "long"},
            {"name": "lsn", "type": ["null", "long"], "default": None},
            {"name": "schema", "type": "string"},
            {"name": "table", "type": "string"},
        ],
    }
    return {
        "type": "record",
        "name": "Envelope",
        "namespace": "db.public.t",
        "fields": [
            {"name": "before", "type": ["null", avro_row_schema(names)], "default": None},
            {"name": "after", "type": ["null", "Value"], "default": None},
            {"name": "source", "type": source},
            {"name": "op", "type": "string"},
        ],
        "connect.name": "db.public.t.Envelope",
    }


KEY_JSON = {"type": "struct", "fields": [{"type": "int32", "optional": False, "field": "id"}]}
KEY_AVRO = {
    "type": "record",
    "name": "Key",
    "namespace": "db.public.t",
    "fields": [{"name": "id", "type": "int"}],
}


def unscaled(value: str, scale: int) -> bytes:
    number = int(decimal.Decimal(value).scaleb(scale))
    return number.to_bytes(max(1, (number.bit_length() + 8) // 8), "big", signed=True)


# Rows as Avro writes them; as_json gives them as JsonConverter writes them.
ROW = {
    "id": 1,
    "small": -32768,
    "price": unscaled("-29293.56", 2),
    "f": 1.5,
    "ts": 1_577_840_523_456_789,
    "d": 18_321,
    "tz": "2020-01-01T01:02:03.456789Z",
    "js": '{"a": 1}',
    "by": b"\x00\xff",
    "tags": ["a", None],
    "hs": {"a": "1", "b": None},
    "vsd": {"scale": 3, "value": unscaled("1.005", 3)},
    "z": 9,
    "dd": unscaled("3.5", 1),
}
EDGES = {  # NaN, an infinity, TOAST placeholders
    **ROW,
    "f": math.nan,
    "ts": 9_223_372_036_825_200_000,
    "js": UNAVAILABLE,
    "by": UNAVAILABLE_BYTES,
    "tags": [UNAVAILABLE],
}
OUT_OF_RANGE = {**ROW, "d": -2_440_550}


def as_json(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    return value


def payload(op: str, after: dict[str, Any] | None, before: dict[str, Any] | None = None) -> Any:
    source = {"ts_ms": 1_700_000_000_000, "lsn": 9, "schema": "public", "table": "t"}
    return {"before": before, "after": after, "source": source, "op": op}


class Twins:
    """One table's events written both ways: Kafka Connect's JSON, Avro through a registry."""

    def __init__(self, registry: SchemaRegistry) -> None:
        self.registry = registry

    def json(self, names: list[str], op: str, after: Any, before: Any = None) -> bytes:
        event = {"schema": json_envelope(names), "payload": as_json(payload(op, after, before))}
        return json.dumps(event, separators=(",", ":")).encode()

    def avro(self, names: list[str], op: str, after: Any, before: Any = None) -> bytes:
        return self.wire("t-value", avro_envelope(names), payload(op, after, before))

    def wire(self, subject: str, schema: dict[str, Any], datum: Any) -> bytes:
        schema_id = self.registry.register(subject, json.dumps(schema))
        body = io.BytesIO()
        fastavro.schemaless_writer(body, fastavro.parse_schema(plain(schema)), datum)
        return b"\x00" + struct.pack(">I", schema_id) + body.getvalue()

    def keys(self, id_: int) -> tuple[bytes, bytes]:
        schema = {"schema": KEY_JSON, "payload": {"id": id_}}
        avro = self.wire("t-key", KEY_AVRO, {"id": id_})
        return json.dumps(schema).encode(), avro


@pytest.fixture
def twins() -> Iterator[Twins]:
    with SchemaRegistry() as registry:
        yield Twins(registry)


def table_fields() -> T.StructType:
    return T.StructType([field_of(c) for c in row_columns(json_envelope(NAMES))])


def test_the_avro_schema_gives_the_columns_its_json_twin_gives():
    from_avro = row_columns(connect_schema(avro_envelope(NAMES)))
    from_json = row_columns(json_envelope(NAMES))
    assert [(c.name, c.data_type, c.default) for c in from_avro] == [
        (c.name, c.data_type, c.default) for c in from_json
    ]
    types = {c.name: c.data_type for c in from_avro}
    assert types["small"] == T.ShortType() and types["price"] == T.DecimalType(10, 2)
    assert types["ts"] == T.TimestampNTZType() and types["tz"] == T.TimestampType()
    assert types["vsd"] == T.StringType() and types["f"] == T.FloatType()
    assert {c.name: c.default for c in from_avro if c.default is not None} == {"z": 7, "dd": "GQ=="}


def _alike(json_change: Change, avro_change: Change) -> None:
    assert repr(avro_change.row) == repr(json_change.row)  # NaN equal to NaN
    assert (avro_change.delete, avro_change.skip, avro_change.error) == (
        json_change.delete,
        json_change.skip,
        json_change.error,
    )
    assert (avro_change.new_schema is None) == (json_change.new_schema is None)


def _envelopes(registry_url: str) -> tuple[Envelope, Envelope]:
    fields = table_fields()
    return Envelope(fields, ("id",), "hard"), Envelope(
        fields, ("id",), "hard", events=AvroEvents(registry_url)
    )


@pytest.mark.parametrize("row", [ROW, EDGES, OUT_OF_RANGE], ids=["values", "edges", "out-of-range"])
def test_each_event_is_the_change_its_json_twin_is(twins, row):
    by_json, by_avro = _envelopes(twins.registry.url)
    json_key, avro_key = twins.keys(1)
    for op in ("r", "c", "u"):
        json_change = by_json.change(json_key, twins.json(NAMES, op, row))
        _alike(json_change, by_avro.change(avro_key, twins.avro(NAMES, op, row)))
    if row is OUT_OF_RANGE:
        assert json_change.error is not None and json_change.error.startswith(UNSTORABLE)
        assert "'d'" in json_change.error
    else:
        assert json_change.row is not None and json_change.error is None


def test_deletes_tombstones_and_an_older_schema_are_read_alike(twins):
    by_json, by_avro = _envelopes(twins.registry.url)
    json_key, avro_key = twins.keys(1)
    delete = (twins.json(NAMES, "d", None, ROW), twins.avro(NAMES, "d", None, ROW))
    _alike(by_json.change(json_key, delete[0]), by_avro.change(avro_key, delete[1]))
    assert by_avro.change(avro_key, delete[1]).row == {"id": 1}
    _alike(by_json.change(json_key, None), by_avro.change(avro_key, None))
    older = [n for n in NAMES if n not in DEFAULTED]  # before the columns with defaults
    row = {n: ROW[n] for n in older}
    json_change = by_json.change(json_key, twins.json(older, "c", row))
    _alike(json_change, by_avro.change(avro_key, twins.avro(older, "c", row)))
    assert json_change.row is not None
    assert (json_change.row["z"], json_change.row["dd"]) == (7, decimal.Decimal("2.5"))


def test_a_new_column_is_a_new_schema_read_alike(twins):
    fields = T.StructType([f for f in table_fields() if f.name != "z"])
    by_json = Envelope(fields, ("id",), "hard")
    by_avro = Envelope(fields, ("id",), "hard", events=AvroEvents(twins.registry.url))
    json_key, avro_key = twins.keys(1)
    json_change = by_json.change(json_key, twins.json(NAMES, "c", ROW))
    avro_change = by_avro.change(avro_key, twins.avro(NAMES, "c", ROW))
    assert json_change.new_schema is not None and avro_change.new_schema is not None
    assert [c.data_type for c in row_columns(json.loads(avro_change.new_schema))] == [
        c.data_type for c in row_columns(json.loads(json_change.new_schema))
    ]


def test_a_value_that_is_no_avro_event_of_the_registry_is_rejected_with_its_reason(twins):
    _, by_avro = _envelopes(twins.registry.url)
    value = twins.avro(NAMES, "c", ROW)
    cases = {
        b"not avro": NOT_CONFLUENT,
        b'{"schema":null,"payload":{}}': NOT_CONFLUENT,
        b"\x00" + struct.pack(">I", 999) + value[5:]: UNKNOWN_SCHEMA_ID,
        value[:-3]: UNDECODABLE,
        value + b"\x00": UNDECODABLE,
    }
    for wrong, reason in cases.items():
        assert by_avro.change(None, wrong).error == reason
    assert envelope_source(value, AvroEvents(twins.registry.url)) == ("public", "t")
    assert envelope_source(value, split) is None


def test_avro_types_without_connect_names_and_maps_of_other_keys():
    record = {
        "type": "record",
        "name": "Value",
        "fields": [
            {"name": "b", "type": {"type": "int", "connect.type": "int8"}},
            {
                "name": "amount",
                "type": {"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 1},
            },
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "mood", "type": {"type": "enum", "name": "Mood", "symbols": ["ok", "sad"]}},
            {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 2}},
            {
                "name": "counts",
                "type": {
                    "type": "array",
                    "items": {
                        "type": "record",
                        "name": "MapEntry",
                        "namespace": "io.confluent.connect.avro",
                        "fields": [
                            {"name": "key", "type": "int"},
                            {"name": "value", "type": "string"},
                        ],
                    },
                },
            },
        ],
    }
    columns = {c.name: c for c in row_columns(connect_schema(record))}
    assert {name: c.data_type for name, c in columns.items()} == {
        "b": T.ByteType(),
        "amount": T.DecimalType(5, 1),
        "day": T.DateType(),
        "at": T.TimestampNTZType(),
        "mood": T.StringType(),
        "hash": T.BinaryType(),
        "counts": T.MapType(T.IntegerType(), T.StringType(), True),
    }
    assert columns["at"].convert(1_000) == 1_000_000  # ms as µs
    assert columns["counts"].convert([{"key": 1, "value": "a"}]) == [(1, "a")]


@pytest.mark.parametrize(
    "avro",
    [
        {"type": "record", "name": "V", "fields": [{"name": "u", "type": ["int", "string"]}]},
        {"type": "record", "name": "V", "fields": [{"name": "u", "type": "nonesuch"}]},
    ],
)
def test_an_avro_schema_no_connect_schema_writes_is_refused(avro):
    with pytest.raises(BadInput):
        connect_schema(avro)
