"""Kafka Connect's types as columns (lagless/cdc/connect_types.py): every logical type Debezium
writes, with the values its JSON converter gives (seen from Debezium 3.6's PostgreSQL
connector, tests/integration/test_mirror.py)."""

from __future__ import annotations

import base64
import datetime
import decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import types as T

from lagless.cdc.connect_types import column_type, for_spark_type
from lagless.exceptions import BadInput


def _decimal_schema(scale: int, precision: int | None = 10) -> dict[str, object]:
    parameters = {"scale": str(scale)}
    if precision is not None:
        parameters["connect.decimal.precision"] = str(precision)
    return {
        "type": "bytes",
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": parameters,
    }


def _unscaled_base64(unscaled: int) -> str:
    size = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()


@pytest.mark.parametrize(
    ("kind", "spark_type", "value", "expected"),
    [
        ("int8", T.ByteType(), -5, -5),
        ("int16", T.ShortType(), 300, 300),
        ("int32", T.IntegerType(), 70000, 70000),
        ("int64", T.LongType(), 2**62, 2**62),
        ("float32", T.FloatType(), 0.5, 0.5),
        ("float64", T.DoubleType(), 1e300, 1e300),
        ("boolean", T.BooleanType(), True, True),
        ("string", T.StringType(), "é", "é"),
        ("bytes", T.BinaryType(), "3q2+7w==", b"\xde\xad\xbe\xef"),
    ],
)
def test_primitive_types(kind, spark_type, value, expected):
    data_type, convert, _ = column_type({"type": kind})
    assert data_type == spark_type
    assert convert(value) == expected


def test_a_decimal_is_exact_with_its_scale_and_precision():
    data_type, convert, _ = column_type(_decimal_schema(2, 10))
    assert data_type == T.DecimalType(10, 2)
    assert convert("AJY=") == decimal.Decimal("1.50")  # seen from Debezium: 1.50
    assert convert(_unscaled_base64(-123456)) == decimal.Decimal("-1234.56")


@given(st.integers(-(10**37), 10**37 - 1), st.integers(0, 20))
def test_any_decimal_round_trips(unscaled, scale):
    _, convert, _ = column_type(_decimal_schema(scale, 38))
    assert convert(_unscaled_base64(unscaled)) == decimal.Decimal(unscaled).scaleb(-scale)


def test_a_decimal_wider_than_spark_keeps_its_exact_text():
    data_type, convert, _ = column_type(_decimal_schema(2, 60))
    assert data_type == T.StringType()
    assert convert(_unscaled_base64(10**50 + 1)) == str(decimal.Decimal(10**50 + 1).scaleb(-2))


def test_a_variable_scale_decimal_is_exact_text():
    schema = {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal"}
    data_type, convert, _ = column_type(schema)
    assert data_type == T.StringType()
    assert convert({"scale": 3, "value": _unscaled_base64(-1005)}) == "-1.005"


def test_decimal_handling_modes_string_and_double_are_text_and_double():
    assert column_type({"type": "string"})[0] == T.StringType()
    assert column_type({"type": "double"})[0] == T.DoubleType()


@pytest.mark.parametrize("name", ["io.debezium.time.Date", "org.apache.kafka.connect.data.Date"])
def test_a_date_is_days_since_the_epoch(name):
    data_type, convert, _ = column_type({"type": "int32", "name": name})
    assert data_type == T.DateType()
    assert convert(19724) == 19724  # 2024-01-02, as Arrow's date32 takes it


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("io.debezium.time.Time", 45296789),
        ("org.apache.kafka.connect.data.Time", 45296789),
        ("io.debezium.time.MicroTime", 45296789000),
        ("io.debezium.time.NanoTime", 45296789000000),
    ],
)
def test_a_time_of_day_is_its_text(name, value):
    data_type, convert, _ = column_type({"type": "int64", "name": name})
    assert data_type == T.StringType()
    assert convert(value) == "12:34:56.789000"


def test_a_whole_second_time_has_no_fraction():
    _, convert, _ = column_type({"type": "int64", "name": "io.debezium.time.MicroTime"})
    assert convert(3_600_000_000) == "01:00:00"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("io.debezium.time.Timestamp", 1704164645123),
        ("org.apache.kafka.connect.data.Timestamp", 1704164645123),
        ("io.debezium.time.MicroTimestamp", 1704164645123000),
        ("io.debezium.time.NanoTimestamp", 1704164645123000999),
    ],
)
def test_a_timestamp_without_zone_is_local_micros(name, value):
    data_type, convert, _ = column_type({"type": "int64", "name": name})
    assert data_type == T.TimestampNTZType()
    assert convert(value) == 1704164645123000


def test_a_zoned_timestamp_is_an_instant():
    data_type, convert, _ = column_type(
        {"type": "string", "name": "io.debezium.time.ZonedTimestamp"}
    )
    assert data_type == T.TimestampType()
    expected = datetime.datetime(2024, 1, 2, 1, 4, 5, 500000, tzinfo=datetime.UTC)
    micros = int(expected.timestamp()) * 1_000_000 + 500000
    assert convert("2024-01-02T01:04:05.500000Z") == micros
    assert convert("2024-01-02T03:04:05.500000+02:00") == micros


@pytest.mark.parametrize(
    "name",
    ["io.debezium.data.Json", "io.debezium.data.Uuid", "io.debezium.data.Enum"],
)
def test_json_uuid_and_enum_are_text(name):
    data_type, convert, _ = column_type({"type": "string", "name": name})
    assert data_type == T.StringType()
    assert convert('{"a": 1}') == '{"a": 1}'


def test_an_array_converts_each_item():
    schema = {"type": "array", "items": {"type": "int32", "name": "io.debezium.time.Date"}}
    data_type, convert, _ = column_type(schema)
    assert data_type == T.ArrayType(T.DateType(), True)
    assert convert([1, None, 3]) == [1, None, 3]
    bytes_array = column_type({"type": "array", "items": {"type": "bytes"}})[1]
    assert bytes_array(["AQ=="]) == [b"\x01"]


def test_a_struct_converts_each_field():
    schema = {
        "type": "struct",
        "fields": [{"type": "bytes", "field": "wkb"}, {"type": "int32", "field": "srid"}],
    }
    data_type, convert, _ = column_type(schema)
    assert data_type.fieldNames() == ["wkb", "srid"]
    assert convert({"wkb": "AQ==", "srid": None}) == {"wkb": b"\x01", "srid": None}


def test_a_type_lagless_cannot_store_is_bad_input():
    with pytest.raises(BadInput, match="cannot be stored"):
        column_type({"type": "nothing"})


def test_without_a_schema_the_value_schema_reads_debezium_defaults():
    assert for_spark_type("p", T.DecimalType(10, 2)).convert("AJY=") == decimal.Decimal("1.50")
    assert for_spark_type("p", T.DecimalType(10, 2)).convert("1.50") == decimal.Decimal("1.50")
    assert for_spark_type("p", T.DecimalType(10, 2)).convert(1.5) == decimal.Decimal("1.5")
    assert for_spark_type("b", T.BinaryType()).convert("AQ==") == b"\x01"
    assert for_spark_type("d", T.DateType()).convert("2024-01-02") == 19724
    zoned = for_spark_type("z", T.TimestampType()).convert("1970-01-01T00:00:01Z")
    assert zoned == 1_000_000
