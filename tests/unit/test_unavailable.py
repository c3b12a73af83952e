"""Debezium's TOAST placeholder in every type it takes (lagless/cdc/unavailable.py): each form
Debezium 3.6 sends (seen from its PostgreSQL connector: tests/integration/test_mirror_types.py)
is the column's one placeholder value, and a property through the real path (the tasks'
change files, the driver's coalescing, the store's upsert) into SQLite, Delta and Iceberg: no
table ever holds the placeholder, whatever the batching and replays; a column keeps its
value, or is NULL where the mirror never held the row (a primary-key change's new row)."""

from __future__ import annotations

import base64
import json
import os
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_type

from lagless.cdc.connect_types import column_type, struct_columns
from lagless.cdc.unavailable import (
    UNAVAILABLE,
    UNAVAILABLE_BYTES,
    UNAVAILABLE_HSTORE,
    UNAVAILABLE_UUID,
    unavailable_json,
    unavailable_mask,
    unavailable_value,
)
from lagless.importer import change_files
from lagless.planner.ranges import OffsetRange
from lagless.sinks import Sink, sink_from_url
from lagless.sinks.base import Target
from lagless.sinks.ledger import Batch
from tests.unit.test_cdc_envelope import compact, envelope_schema
from tests.unit.test_change_files import records
from tests.unit.test_upsert_rank import iceberg_table

CODES = list(UNAVAILABLE_BYTES)
B64 = base64.b64encode(UNAVAILABLE_BYTES).decode()


@pytest.mark.parametrize(
    ("schema", "sent"),
    [
        ({"type": "string"}, UNAVAILABLE),
        ({"type": "string", "name": "io.debezium.data.Xml"}, UNAVAILABLE),
        ({"type": "string", "name": "io.debezium.data.Json"}, UNAVAILABLE),
        ({"type": "string", "name": "io.debezium.data.Json"}, UNAVAILABLE_HSTORE),
        ({"type": "bytes"}, B64),
        ({"type": "array", "items": {"type": "string"}}, [UNAVAILABLE]),
        (
            {"type": "array", "items": {"type": "string", "name": "io.debezium.data.Uuid"}},
            [UNAVAILABLE_UUID],
        ),
        (
            {"type": "array", "items": {"type": "string", "name": "io.debezium.data.Json"}},
            [UNAVAILABLE],
        ),
        ({"type": "array", "items": {"type": "bytes"}}, [B64]),
        ({"type": "array", "items": {"type": "int32"}}, CODES),
        ({"type": "array", "items": {"type": "int64"}}, CODES),
        ({"type": "array", "items": {"type": "int32", "name": "io.debezium.time.Date"}}, CODES),
        (
            {"type": "map", "keys": {"type": "string"}, "values": {"type": "string"}},
            {UNAVAILABLE: UNAVAILABLE},
        ),
    ],
)
def test_each_form_debezium_sends_is_the_columns_placeholder(schema, sent):
    data_type, convert, _ = column_type(schema)
    column = pa.array([convert(sent), None], to_arrow_type(data_type))
    assert column.to_pylist()[0] == unavailable_value(data_type)
    assert unavailable_mask(column, data_type).to_pylist() == [True, False]


def test_a_real_value_is_never_the_placeholder():
    data_type, convert, _ = column_type({"type": "array", "items": {"type": "int32"}})
    values = pa.array(
        [convert(CODES[:-1]), convert([*CODES[1:], 1]), [], None], pa.list_(pa.int32())
    )
    assert unavailable_mask(values, data_type).to_pylist() == [False] * 4


def test_nested_placeholders_as_spark_writes_them_to_json():
    assert unavailable_json(T.ArrayType(T.StringType())) == f'["{UNAVAILABLE}"]'
    assert unavailable_json(T.ArrayType(T.IntegerType())) == json.dumps(CODES).replace(" ", "")
    assert (unavailable_json(T.ArrayType(T.DateType())) or "").startswith('["1970-04-06",')
    assert unavailable_json(T.MapType(T.StringType(), T.StringType())) == UNAVAILABLE_HSTORE
    assert unavailable_json(T.StringType()) is None
    assert unavailable_value(T.ArrayType(T.ShortType())) is None  # Debezium sends NULL


# --- the property: no store ever holds the placeholder ---

KEY = {"type": "int32", "optional": False, "field": "id"}
ROW_FIELDS: list[dict[str, Any]] = [
    KEY,
    {"type": "int64", "field": "n"},
    {"type": "string", "field": "note"},
    {"type": "bytes", "field": "blob"},
    {"type": "string", "name": "io.debezium.data.Json", "field": "hs"},
    {"type": "array", "items": {"type": "string"}, "field": "tags"},
    {"type": "array", "items": {"type": "int32"}, "field": "nums"},
]
TOASTED = ("note", "blob", "hs", "tags", "nums")
SENT = {
    "note": UNAVAILABLE,
    "blob": B64,
    "hs": UNAVAILABLE_HSTORE,
    "tags": [UNAVAILABLE],
    "nums": CODES,
}
FIELDS = T.StructType(
    [T.StructField(c.name, c.data_type) for c in struct_columns({"fields": ROW_FIELDS})]
)
TARGET = Target("t", "upsert", "debezium", FIELDS, ("id",))
TOPIC = "db.public.t"
PARTITIONS = 2


def _event(op: str, after: dict[str, Any] | None, before: dict[str, Any] | None = None) -> bytes:
    payload = {"before": before, "after": after, "source": {"ts_ms": 1, "lsn": 1}, "op": op}
    return compact({"schema": envelope_schema(ROW_FIELDS), "payload": payload})


def _key(id_: int) -> bytes:
    return compact({"schema": {"type": "struct", "fields": [KEY]}, "payload": {"id": id_}})


def _sent(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "blob": None if row["blob"] is None else base64.b64encode(row["blob"]).decode()}


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[tuple[int, bytes, bytes | None]], dict[int, Any]]:
    """Debezium's events of a random history ((id, key, value) in order) and the table a
    mirror must end with: the source's, a column NULL where its value never reached the
    mirror (a key change's new row under the default REPLICA IDENTITY)."""
    values = st.fixed_dictionaries(
        {
            "n": st.integers(-5, 5),
            "note": st.none() | st.text("ab", max_size=3),
            "blob": st.none() | st.binary(max_size=3),
            "hs": st.none() | st.just('{"a":"1"}'),
            "tags": st.none() | st.lists(st.text("ab", max_size=2), max_size=2),
            "nums": st.none() | st.lists(st.integers(-3, 3), max_size=2),
        }
    )
    table: dict[int, dict[str, Any]] = {}
    events: list[tuple[int, bytes, bytes | None]] = []
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["insert", "update", "toast", "delete", "rekey"]))
        if kind == "insert" or not table:
            id_ = max(table, default=0) + 1 + draw(st.integers(0, 3))
            table[id_] = {"id": id_, **draw(values)}
            events.append((id_, _key(id_), _event("c", _sent(table[id_]))))
            continue
        id_ = draw(st.sampled_from(sorted(table)))
        if kind == "update":
            table[id_] = {"id": id_, **draw(values)}
            events.append((id_, _key(id_), _event("u", _sent(table[id_]))))
        elif kind == "toast":  # only n changes: every TOASTed column comes as the placeholder
            row = table[id_] = {**table[id_], "n": draw(st.integers(-5, 5))}
            events.append((id_, _key(id_), _event("u", {**_sent(row), **SENT})))
        else:
            row = table.pop(id_)
            events.append((id_, _key(id_), _event("d", None, {"id": id_})))
            events.append((id_, _key(id_), None))
            if kind == "rekey":
                new = max([*table, id_]) + 1
                table[new] = {**row, "id": new, **dict.fromkeys(TOASTED)}  # unknown: NULL
                events.append((new, _key(new), _event("c", {**_sent(row), "id": new, **SENT})))
    return events, table


def _as_sql_text(rows: pa.Table) -> pa.Table:
    """Nested columns as JSON text, as Spark's to_json hands them to the SQL stores."""
    for at, field in enumerate(rows.schema):
        if pa.types.is_list(field.type):
            texts = [
                None if v is None else json.dumps(v, separators=(",", ":"))
                for v in rows.column(at).to_pylist()
            ]
            rows = rows.set_column(at, field.name, pa.array(texts, pa.string()))
    return rows


def _upsert(sink: Sink, store: str, folder: Path, batch_id: int, ranges, log) -> None:
    files = []
    for partition, (start, end) in ranges.items():
        if end > start:
            batch = records(partition, start, log[partition][start:end])
            config = json.loads(
                change_files.task_config(str(folder / f"b{batch_id}"), {TOPIC: TARGET})
            )
            piece = [OffsetRange(TOPIC, partition, start, end)]
            files.append(change_files.writer(config).write(piece, iter([batch]))[0])
    done = change_files.coalesce(change_files.read_changes(files), TARGET, {})
    assert done.rejected.num_rows == 0
    batch = Batch(batch_id, {(TOPIC, p): r for p, r in ranges.items()})
    batch.log_times.update(done.newest)
    rows = _as_sql_text(done.rows) if store == "sqlite" else done.rows
    sink.upsert_rows(rows, replace(TARGET, fields=FIELDS), batch)


def _mirrored(sink: Sink, store: str) -> dict[int, dict[str, Any]]:
    names = [f.name for f in FIELDS]
    if store == "sqlite":
        with sqlite3.connect(sink.location) as conn:
            found = [
                dict(zip(names, r, strict=True))
                for r in conn.execute(f"SELECT {', '.join(names)} FROM t")
            ]
        for row in found:
            row.update(
                {c: None if row[c] is None else json.loads(row[c]) for c in ("tags", "nums")}
            )
    elif store == "delta":
        path = os.path.join(sink.location, "t")
        found = pl.read_delta(path, columns=names).to_dicts() if os.path.isdir(path) else []
    else:
        found = [
            dict(zip(names, r, strict=True))
            for r in iceberg_table(sink.location, names, "default.t")
        ]
    return {
        row["id"]: {**row, "blob": None if row["blob"] is None else bytes(row["blob"])}
        for row in found
    }


@pytest.mark.parametrize("store", ["sqlite", "delta", "iceberg"])
@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    history=histories(),
    cuts=st.lists(st.integers(1, 5), min_size=1, max_size=6),
    replays=st.lists(st.integers(0, 12), max_size=3),
)
def test_no_store_ever_holds_the_placeholder(tmp_path_factory, store, history, cuts, replays):
    events, source = history
    log: dict[int, list[tuple[bytes, bytes | None]]] = {p: [] for p in range(PARTITIONS)}
    for id_, key, value in events:
        log[id_ % PARTITIONS].append((key, value))
    folder: Path = tmp_path_factory.mktemp(store)
    url = f"sqlite:///{folder}/m.db" if store == "sqlite" else f"{store}:///{folder}/lake"
    sink = sink_from_url(url)
    sink.prepare(TARGET)
    batches, positions, step = [], dict.fromkeys(range(PARTITIONS), 0), 0
    while any(positions[p] < len(log[p]) for p in positions):
        size = cuts[step % len(cuts)]
        ranges = {p: (positions[p], min(len(log[p]), positions[p] + size)) for p in positions}
        positions = {p: end for p, (_, end) in ranges.items()}
        batches.append(ranges)
        step += 1
    order = list(range(len(batches)))
    for replay in replays:  # a batch again, later (its rows lose to the newer ones held)
        if batches:
            order.insert(min(replay, len(order)), order[min(replay, len(order) - 1)])
    for index in [*order, *range(len(batches))]:
        _upsert(sink, store, folder, index, batches[index], log)
    mirrored = _mirrored(sink, store)
    for row in mirrored.values():
        for name in TOASTED:
            assert row[name] != unavailable_value(FIELDS[name].dataType), (name, row)
    differing = {k: (mirrored.get(k), source.get(k)) for k in {*mirrored, *source}}
    wrong = {k: pair for k, pair in differing.items() if pair[0] != pair[1]}
    assert not wrong, f"(mirror, source) by key: {wrong}"
