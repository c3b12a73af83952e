"""A batch of change events read at once (cdc/columnar.py) equals the same batch read an event
at a time (cdc/envelope.py): every Connect type, with and without the schema, upserts,
deletes, tombstones, rejected events; and the common batches are read at once."""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_type

from lagless.cdc import columnar
from lagless.cdc.connect_types import UNAVAILABLE, struct_columns
from lagless.cdc.envelope import CDC_COLUMNS, CDC_TYPES
from lagless.importer.change_files import ChangeFiles

TOPIC = "db.public.things"


def _unscaled_base64(unscaled: int) -> str:
    size = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()


def _zoned(moment: datetime.datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def _compact(value: Any) -> bytes:
    """As Kafka Connect's JsonConverter writes a value: no spaces."""
    return json.dumps(value, separators=(",", ":")).encode()


_UTC = datetime.UTC
# Each column: its Connect schema, and the JSON values Debezium writes for it.
COLUMNS: dict[str, tuple[dict[str, Any], st.SearchStrategy[Any]]] = {
    "small": ({"type": "int16"}, st.integers(-(2**15), 2**15 - 1)),
    "big": ({"type": "int64"}, st.integers(-(2**63), 2**63 - 1)),
    "ratio": ({"type": "double"}, st.floats(allow_nan=False, allow_infinity=False)),
    "single": ({"type": "float"}, st.floats(width=32, allow_nan=False, allow_infinity=False)),
    "flag": ({"type": "boolean"}, st.booleans()),
    "note": ({"type": "string"}, st.text(max_size=12) | st.just(UNAVAILABLE)),
    "blob": ({"type": "bytes"}, st.binary(max_size=8).map(lambda b: base64.b64encode(b).decode())),
    "amount": (
        {
            "type": "bytes",
            "name": "org.apache.kafka.connect.data.Decimal",
            "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        },
        st.integers(-(10**10) + 1, 10**10 - 1).map(_unscaled_base64),
    ),
    "day": (
        {"type": "int32", "name": "io.debezium.time.Date"},
        st.integers(-100_000, 100_000),
    ),
    "at_micros": (
        {"type": "int64", "name": "io.debezium.time.MicroTimestamp"},
        st.integers(-(2**50), 2**50),
    ),
    "at_millis": (
        {"type": "int64", "name": "org.apache.kafka.connect.data.Timestamp"},
        st.integers(-(2**40), 2**40),
    ),
    "at_nanos": (
        {"type": "int64", "name": "io.debezium.time.NanoTimestamp"},
        st.integers(-(2**62), 2**62),
    ),
    "zoned": (
        {"type": "string", "name": "io.debezium.time.ZonedTimestamp"},
        st.datetimes(
            min_value=datetime.datetime(1900, 1, 1), max_value=datetime.datetime(2200, 1, 1)
        ).map(lambda moment: _zoned(moment.replace(tzinfo=_UTC))),
    ),
    "time_of_day": (
        {"type": "int64", "name": "io.debezium.time.MicroTime"},
        st.integers(0, 86_400 * 10**6 - 1),
    ),
    "doc": ({"type": "string", "name": "io.debezium.data.Json"}, st.just('{"a": [1, 2]}')),
}
ID = ({"type": "int32", "optional": False}, st.integers(-(2**31), 2**31 - 1))


def _after_schema(names: list[str]) -> dict[str, Any]:
    fields = [{"field": "id", **ID[0]}]
    fields += [{"field": name, "optional": True, **COLUMNS[name][0]} for name in names]
    return {"type": "struct", "fields": fields, "optional": True, "name": "db.Value"}


def _envelope_schema(after: dict[str, Any]) -> dict[str, Any]:
    source = {
        "type": "struct",
        "field": "source",
        "fields": [{"field": "ts_ms", "type": "int64"}, {"field": "lsn", "type": "int64"}],
    }
    return {
        "type": "struct",
        "name": "db.Envelope",
        "fields": [
            {**after, "field": "before"},
            {**after, "field": "after"},
            source,
            {"field": "op", "type": "string"},
        ],
    }


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[str], bool, bool, list[tuple[Any, Any]]]:
    """(the columns, with the schema, with the mirror's own columns, [(key, value)])."""
    with_schema, cdc = draw(st.booleans()), draw(st.booleans())
    # Without the schema, --value-schema's types read the JSON Debezium writes; a time of day
    # (µs, a number) would be a string column's and fail either way.
    offered = sorted(COLUMNS) if with_schema else sorted(set(COLUMNS) - {"time_of_day"})
    names = draw(st.lists(st.sampled_from(offered), min_size=1, max_size=5, unique=True))
    schema = _envelope_schema(_after_schema(names))
    events = []
    for _ in range(draw(st.integers(1, 25))):
        key = draw(ID[1])
        kind = draw(st.sampled_from(["u"] * 8 + ["r", "c", "d", "tombstone", "t", "junk", "nokey"]))
        if kind == "tombstone":
            events.append((json.dumps({"id": key}).encode(), None))
            continue
        if kind == "junk":
            events.append((json.dumps({"id": key}).encode(), b"not json"))
            continue
        after = {"id": None if kind == "nokey" else key}
        for name in names:
            after[name] = draw(st.none() | COLUMNS[name][1])
        payload = {
            "before": None,
            "after": None if kind in ("d", "t") else after,
            "source": {"ts_ms": draw(st.integers(0, 2**45)), "lsn": draw(st.integers(0, 2**40))},
            "op": "u" if kind == "nokey" else kind,
        }
        value = {"schema": schema, "payload": payload} if with_schema else payload
        events.append((json.dumps({"id": key}).encode(), _compact(value)))
    return names, with_schema, cdc, events


def _writer(names: list[str], with_schema: bool, cdc: bool) -> ChangeFiles:
    if with_schema:
        columns = struct_columns(_after_schema(names))
        fields = [T.StructField(c.name, c.data_type, True) for c in columns]
    else:  # --value-schema: what the table's columns are, the events not saying
        fields = [T.StructField("id", T.IntegerType(), True)]
        fields += [
            T.StructField(c.name, c.data_type, True)
            for c in struct_columns(_after_schema(names))[1:]
        ]
    if cdc:
        fields += [T.StructField(name, CDC_TYPES[name](), True) for name in CDC_COLUMNS]
    table = {"table": "things", "fields": T.StructType(fields).json(), "key_fields": ["id"]}
    return ChangeFiles("/nowhere", {TOPIC: table})


def _batch(events: list[tuple[Any, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "topic": pa.array([TOPIC] * len(events)),
            "partition": pa.array([0] * len(events), pa.int32()),
            "offset": pa.array(range(len(events)), pa.int64()),
            "key": pa.array([k for k, _ in events], pa.binary()),
            "value": pa.array([v for _, v in events], pa.binary()),
            "timestamp": pa.array([1_764_400_000_000] * len(events), pa.int64()),
        }
    )


def _decoded_each_at_a_time(
    writer: ChangeFiles, batch: pa.RecordBatch, monkeypatch: pytest.MonkeyPatch
) -> pa.RecordBatch:
    with monkeypatch.context() as patched:
        patched.setattr(columnar, "changes", lambda *args: None)
        return writer._decode(batch)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=batches())
def test_a_batch_read_at_once_equals_it_read_an_event_at_a_time(
    drawn: tuple[list[str], bool, bool, list[tuple[Any, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    names, with_schema, cdc, events = drawn
    batch = _batch(events)
    at_once = _outcome(lambda: _writer(names, with_schema, cdc)._decode(batch))
    each = _outcome(
        lambda: _decoded_each_at_a_time(_writer(names, with_schema, cdc), batch, monkeypatch)
    )
    if isinstance(at_once, pa.RecordBatch) and isinstance(each, pa.RecordBatch):
        assert at_once.equals(each), (at_once.to_pydict(), each.to_pydict())
    else:
        assert at_once == each


def _outcome(decode: Any) -> Any:
    """The decoded batch, or the error that refused it."""
    try:
        decoded = decode()
    except Exception as exc:  # a value its column cannot take fails the task either way
        return type(exc).__name__
    return decoded


@pytest.mark.parametrize("with_schema", [True, False])
def test_upserts_deletes_and_tombstones_are_read_at_once(with_schema: bool) -> None:
    """The common batch takes the columnar reading (else the test above proves nothing)."""
    names = sorted(COLUMNS) if with_schema else sorted(set(COLUMNS) - {"time_of_day"})
    schema = _envelope_schema(_after_schema(names))
    row = {"id": 1, "small": 3, "big": 2**40, "ratio": 0.5, "single": 1.5, "flag": True}
    row |= {"note": "x", "blob": "AAE=", "amount": _unscaled_base64(-12345), "day": 19000}
    row |= {"at_micros": 1, "at_millis": 2, "at_nanos": 3999, "zoned": "2026-01-02T03:04:05Z"}
    row |= {"doc": "{}"} | ({"time_of_day": 1_000_000} if with_schema else {})
    events: list[tuple[Any, Any]] = []
    for op in ("r", "u", "d"):
        payload = {"after": None if op == "d" else row, "op": op, "source": {"ts_ms": 5}}
        value = {"schema": schema, "payload": payload} if with_schema else payload
        events.append((b'{"id":1}', _compact(value)))
    events.append((b'{"id":1}', None))
    writer = _writer(names, with_schema, cdc=True)
    envelope = writer._envelope(TOPIC)
    batch = _batch(events)
    row_type = to_arrow_type(envelope.fields, timezone="UTC")
    decoded = columnar.changes(envelope, batch.column("key"), batch.column("value"), row_type)
    assert decoded is not None
    assert decoded.delete.to_pylist() == [False, False, True, True]
    first = decoded.rows[0].as_py()
    assert first["amount"] == decimal.Decimal("-123.45")
    # Without the schema, --value-schema's timestamp is µs: nothing says these are ns.
    micros = 3 if with_schema else 3999
    assert first["at_nanos"] == datetime.datetime(1970, 1, 1, 0, 0, 0, micros)
    assert first["zoned"] == datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=_UTC)
    assert first["_op"] == "r" and first["_source_ts_ms"] == 5


def test_a_batch_of_two_schemas_is_read_an_event_at_a_time() -> None:
    """A column added upstream mid-batch: the table grows first, event by event."""
    old = _envelope_schema(_after_schema(["note"]))
    new = _envelope_schema(_after_schema(["note", "flag"]))
    events = [
        (b'{"id":1}', _compact({"schema": schema, "payload": {"op": "u", "after": after}}))
        for schema, after in ((old, {"id": 1, "note": "a"}), (new, {"id": 1, "flag": True}))
    ]
    writer = _writer(["note"], True, cdc=False)
    decoded = writer._decode(_batch(events))
    assert decoded.column("flag").to_pylist() == [None, True]
    assert decoded.column("_lagless_schema").to_pylist()[1] is not None


@given(
    st.lists(st.integers(-(2**63), 2**63 - 1) | st.none(), min_size=1, max_size=20),
    st.booleans(),
)
def test_base64_unscaled_values_read_at_once_as_python_reads_them(
    unscaled: list[int | None], sign_extended: bool
) -> None:
    """Connect's Decimal bytes (Java's BigInteger: the fewest bytes, or a byte more) as
    decimal(18, 2) at once; a value past 18 digits leaves it to each value's convert."""
    from lagless.cdc.connect_types import _decimal

    def encoded(value: int) -> str:
        size = max(1, ((value if value >= 0 else ~value).bit_length() + 8) // 8)
        size = min(8, size + sign_extended)
        return base64.b64encode(value.to_bytes(size, "big", signed=True)).decode()

    texts = pa.array([None if v is None else encoded(v) for v in unscaled], pa.string())
    target = pa.decimal128(18, 2)
    decoded = columnar._decimals(texts, target, guessed=False)
    if any(v is not None and abs(v) >= 10**18 for v in unscaled):
        assert decoded is None
        return
    convert = _decimal(2)
    assert decoded is not None
    assert decoded.to_pylist() == [None if v is None else convert(encoded(v)) for v in unscaled]


def test_malformed_base64_is_left_to_each_values_convert() -> None:
    """Padding inside the text, too much of it, or no padding where it is due: Python's
    b64decode refuses them, so the batch's decimals are not read at once."""
    for text in ("A=AA", "AB=A", "A===", "AAA"):
        texts = pa.array([text], pa.string())
        assert columnar._decimals(texts, pa.decimal128(18, 2), guessed=False) is None
    assert columnar._decimals(pa.array(["AAE="]), pa.decimal128(18, 2), guessed=False) is not None
