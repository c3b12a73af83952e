"""Every value Debezium sends lands as its column's rule says, or its event is rejected alone
with the reason (lagless/cdc/connect_types.py, envelope.py, columnar.py): NaN and infinite
floats, PostgreSQL's infinite dates and timestamps (as Debezium 3.6 sends them: seen in
tests/integration/test_mirror_types.py), values out of the range every store holds, and a
property that no value of any JSON type stops a batch."""

from __future__ import annotations

import json
import math
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_type

from lagless.cdc import columnar
from lagless.cdc.connect_types import (
    FIRST_DAY,
    FIRST_MICROS,
    LAST_DAY,
    LAST_MICROS,
    column_type,
    for_spark_type,
    struct_columns,
)
from lagless.cdc.envelope import UNSTORABLE, Envelope
from tests.unit.test_cdc_envelope import compact, envelope_schema

KEY = {"type": "int32", "optional": False, "field": "id"}
# One field of each kind of Connect schema Debezium's PostgreSQL connector writes.
FIELDS: list[dict[str, Any]] = [
    {"type": "float", "field": "r"},
    {"type": "double", "field": "d"},
    {"type": "int16", "field": "i16"},
    {"type": "int64", "field": "i64"},
    {"type": "boolean", "field": "b"},
    {"type": "string", "field": "s"},
    {"type": "bytes", "field": "raw"},
    {
        "type": "bytes",
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "2", "connect.decimal.precision": "12"},
        "field": "dec",
    },
    {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "field": "vsd"},
    {"type": "int32", "name": "io.debezium.time.Date", "field": "dt"},
    {"type": "int64", "name": "io.debezium.time.MicroTime", "field": "tm"},
    {"type": "int64", "name": "io.debezium.time.Timestamp", "field": "ts_ms"},
    {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "field": "ts_us"},
    {"type": "int64", "name": "io.debezium.time.NanoTimestamp", "field": "ts_ns"},
    {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "field": "tstz"},
    {"type": "string", "name": "io.debezium.data.Json", "field": "js"},
    {"type": "array", "items": {"type": "int32"}, "field": "ints"},
    {"type": "array", "items": {"type": "string"}, "field": "texts"},
    {"type": "map", "keys": {"type": "string"}, "values": {"type": "string"}, "field": "hs"},
]


def _envelope() -> tuple[Envelope, pa.StructType]:
    columns = struct_columns({"fields": [KEY, *FIELDS]})
    fields = T.StructType([T.StructField(c.name, c.data_type) for c in columns])
    return Envelope(fields, ("id",), "hard"), to_arrow_type(fields, timezone="UTC")


def _event(after: dict[str, Any]) -> bytes:
    payload = {"before": None, "after": after, "source": {"ts_ms": 1, "lsn": 1}, "op": "u"}
    return compact({"schema": envelope_schema([KEY, *FIELDS]), "payload": payload})


@pytest.mark.parametrize(
    ("kind", "sent", "stored"),
    [
        ("float", "NaN", math.nan),
        ("float", "Infinity", math.inf),
        ("double", "-Infinity", -math.inf),
        ("double", 2.5, 2.5),
    ],
)
def test_nan_and_infinite_floats_are_stored_as_such(kind, sent, stored):
    _, convert, _ = column_type({"type": kind})
    value = convert(sent)
    assert (math.isnan(value) and math.isnan(stored)) or value == stored


def test_text_that_is_no_number_is_refused_in_a_float_column():
    _, convert, _ = column_type({"type": "double"})
    with pytest.raises(ValueError, match="not a number"):
        convert("nan!")


@pytest.mark.parametrize(
    ("name", "sent", "stored"),
    [
        # PostgreSQL's infinity and -infinity as Debezium 3.6 sends them
        ("io.debezium.time.MicroTimestamp", 9_223_372_036_825_200_000, LAST_MICROS),
        ("io.debezium.time.MicroTimestamp", -9_223_372_036_832_400_000, FIRST_MICROS),
        ("io.debezium.time.Timestamp", 9_223_372_036_825_200, LAST_MICROS),
        ("io.debezium.time.Timestamp", -9_223_372_036_832_400, FIRST_MICROS),
        ("io.debezium.time.ZonedTimestamp", "infinity", LAST_MICROS),
        ("io.debezium.time.ZonedTimestamp", "-infinity", FIRST_MICROS),
        ("io.debezium.time.Date", -622_191_234, LAST_DAY),
        ("io.debezium.time.Date", -625_821_272, FIRST_DAY),
        ("io.debezium.time.Date", -2_147_472_692, LAST_DAY),  # streamed, not snapshot
        ("io.debezium.time.Date", -2_147_472_691, FIRST_DAY),
        # the range's own ends are exact
        ("io.debezium.time.Timestamp", 253_402_300_799_999, 253_402_300_799_999_000),
        ("io.debezium.time.Date", LAST_DAY, LAST_DAY),
        ("io.debezium.time.ZonedTimestamp", "0001-01-01T00:00:00Z", FIRST_MICROS),
    ],
)
def test_infinity_is_the_last_or_first_instant_every_store_holds(name, sent, stored):
    kind = "string" if "Zoned" in name else "int64"
    _, convert, _ = column_type({"type": kind, "name": name})
    assert convert(sent) == stored


@pytest.mark.parametrize(
    ("name", "sent"),
    [
        ("io.debezium.time.Timestamp", -210_863_520_000_000),  # 4713-01-01 BC
        ("io.debezium.time.Timestamp", 253_402_300_800_123),  # 10000-01-01
        ("io.debezium.time.MicroTimestamp", 9_223_372_036_854_775_807),  # 294276-12-31
        ("io.debezium.time.Date", 2_932_897),  # 10000-01-01
        ("io.debezium.time.Date", -2_440_550),  # 4713-01-01 BC, streamed
        ("io.debezium.time.ZonedTimestamp", "+10000-01-01T00:00:00.000000Z"),
    ],
)
def test_a_date_or_timestamp_out_of_range_is_refused(name, sent):
    kind = "string" if "Zoned" in name else "int64"
    _, convert, _ = column_type({"type": kind, "name": name})
    with pytest.raises(ValueError, match="0001-01-01"):
        convert(sent)


def test_a_value_schema_reads_floats_and_timestamps_by_the_same_rules():
    assert math.isinf(for_spark_type("r", T.FloatType()).convert("Infinity"))
    assert for_spark_type("t", T.TimestampType()).convert("infinity") == LAST_MICROS
    stamp = for_spark_type("t", T.TimestampNTZType()).convert
    assert stamp(-9_223_372_036_832_400_000) == FIRST_MICROS
    with pytest.raises(ValueError):
        stamp(2**62)


def test_one_unstorable_value_rejects_its_event_alone():
    envelope, row_type = _envelope()
    events = [
        _event({"id": 1, "r": "NaN", "ts_ms": 9_223_372_036_825_200}),
        _event({"id": 2, "dt": 2_932_897}),  # 10000-01-01
        _event({"id": 3, "i16": 70_000}),  # Arrow refuses it as int16
        _event({"id": 4, "tstz": "-infinity", "d": "Infinity"}),
    ]
    decoded = columnar.of_changes([envelope.change(b'{"id":0}', e) for e in events], row_type)
    rows, errors = decoded.rows.to_pylist(), decoded.error.to_pylist()
    assert [row is not None for row in rows] == [True, False, False, True]
    assert errors[0] is None and errors[3] is None
    assert errors[1].startswith(UNSTORABLE) and "'dt'" in errors[1] and "0001-01-01" in errors[1]
    assert errors[2].startswith(UNSTORABLE) and "'i16'" in errors[2]
    assert math.isnan(rows[0]["r"]) and rows[3]["d"] == math.inf


def test_a_batch_with_nan_or_infinity_reads_at_once_as_an_event_at_a_time():
    envelope, row_type = _envelope()
    keys = pa.array([b'{"id":1}'] * 3, pa.binary())
    values = pa.array(
        [
            _event({"id": 1, "d": "NaN", "ts_us": 1}),
            _event({"id": 2, "d": 1.5, "ts_us": 9_223_372_036_825_200_000}),
            _event({"id": 3, "d": "-Infinity", "ts_us": 2}),
        ],
        pa.binary(),
    )
    at_once = columnar.changes(envelope, keys, values, row_type)
    each = columnar.of_changes(
        [envelope.change(k, v) for k, v in zip(keys.to_pylist(), values.to_pylist(), strict=True)],
        row_type,
    )
    shown = each.rows.to_pylist()
    assert [r["ts_us"] for r in shown][1].year == 9999
    if at_once is not None:
        assert str(at_once.rows.to_pylist()) == str(shown)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.sampled_from(["NaN", "Infinity", "-Infinity", "infinity", "AJY=", "1.5", "-0"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)


@settings(max_examples=300)
@given(st.lists(st.fixed_dictionaries({}, optional={f["field"]: JSON_VALUES for f in FIELDS})))
def test_no_value_of_any_json_type_stops_a_batch(afters):
    """Whatever JSON each column brings, each event becomes a row Arrow holds, or is rejected
    alone with its reason; the batch is read whole either way."""
    envelope, row_type = _envelope()
    events = [_event({"id": at, **after}) for at, after in enumerate(afters)]
    keys = [json.dumps({"id": at}).encode() for at in range(len(events))]
    decoded = columnar.of_changes(
        [envelope.change(k, v) for k, v in zip(keys, events, strict=True)], row_type
    )
    assert len(decoded.rows) == len(events)
    for row, error in zip(decoded.rows.to_pylist(), decoded.error.to_pylist(), strict=True):
        assert (row is None) != (error is None)
        assert error is None or error.startswith(UNSTORABLE)
    at_once = columnar.changes(
        envelope, pa.array(keys, pa.binary()), pa.array(events, pa.binary()), row_type
    )
    if at_once is not None:
        assert at_once.error.to_pylist() == decoded.error.to_pylist()


@pytest.mark.parametrize(
    ("precision", "scale", "sent", "stored"),
    [
        # base64 of the unscaled value (decimal.handling.mode=precise, Debezium's default),
        # among them base64 made of digits alone (read as text before: 0.00 and 9999.00)
        (12, 2, "0000", "-29293.56"),
        (12, 2, "9999", "-5326.11"),
        (12, 2, "AJY=", "1.50"),
        (12, 2, "+AB=", "-20.48"),
        # a VariableScaleDecimal struct (a numeric without scale)
        (12, 2, {"scale": 1, "value": "Iw=="}, "3.50"),
        # string and double modes
        (12, 2, "-12", "-12.00"),
        (12, 2, "1234.5", "1234.50"),
        (12, 2, 1234.5, "1234.50"),
        (10, 0, 7, "7"),
    ],
)
def test_a_schemaless_decimal_is_decoded_exactly(precision, scale, sent, stored):
    convert = for_spark_type("n", T.DecimalType(precision, scale)).convert
    assert str(convert(sent)) == stored


@pytest.mark.parametrize(
    ("precision", "scale", "sent", "reason"),
    [
        (12, 2, "1234.567", "does not fit"),  # more decimals than the column holds
        (4, 2, "123.00", "does not fit"),  # more digits
        (12, 2, 0.1 + 0.2, "does not fit"),  # a double that is no decimal of scale 2
        (12, 2, "NaN", "no number"),
        (10, 0, "1234", "base64 .* and a number's text"),  # cannot tell the mode
        (12, 2, ["AJY="], "no decimal"),
    ],
)
def test_a_schemaless_decimal_that_cannot_be_decoded_exactly_is_refused(
    precision, scale, sent, reason
):
    convert = for_spark_type("n", T.DecimalType(precision, scale)).convert
    with pytest.raises((ValueError, TypeError), match=reason):
        convert(sent)


def test_a_decimal_sent_as_a_number_is_refused_not_read_as_that_many_bytes():
    """Connect's Decimal is bytes (base64 in JSON). A number where they belong is refused:
    read as bytes it was that many zero bytes (25 GB for this one, found by the test above)."""
    from lagless.cdc.connect_types import _decimal

    with pytest.raises(ValueError, match="is not a decimal's bytes"):
        _decimal(2)(25_276_182_474)
    assert str(_decimal(2)("AJY=")) == "1.50"
