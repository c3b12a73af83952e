"""Debezium's TOAST placeholder in every type it takes (lagless/cdc/unavailable.py): each form
Debezium 3.6 sends (seen from its PostgreSQL connector: tests/integration/test_mirror_types.py)
is the column's one placeholder value, and a property through the real path (the tasks'
change files, the driver's coalescing, the store's upsert) into SQLite, Delta and Iceberg: no
table ever holds the placeholder, whatever the batching, replays and the order a primary-key
change's delete and create arrive in; a column keeps its value, a key change's new row takes
the old row's (cdc/key_change.py), and without Kafka Connect's headers a value the mirror
cannot know is NULL and marked."""

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
from lagless.cdc.key_change import NEW_KEY, OLD_KEY, UNKNOWN, unknown_columns
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
from lagless.source.schema import HEADER_TYPE
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
# A record: its key's id (its partition), Kafka key, value and headers.
Event = tuple[int, bytes, bytes | None, list[tuple[str, bytes]]]


def _event(op: str, after: dict[str, Any] | None, lsn: int, before: Any = None) -> bytes:
    """A change event at `lsn` (a key change's delete and create share it, as in PostgreSQL)."""
    source = {"ts_ms": 1, "lsn": lsn, "txId": lsn // 10}
    payload = {"before": before, "after": after, "source": source, "op": op}
    return compact({"schema": envelope_schema(ROW_FIELDS), "payload": payload})


def _key(id_: int) -> bytes:
    return compact({"schema": {"type": "struct", "fields": [KEY]}, "payload": {"id": id_}})


def _sent(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "blob": None if row["blob"] is None else base64.b64encode(row["blob"]).decode()}


def _changed(draw: st.DrawFn, table: dict[int, Any], id_: int, kind: str, lsn: int) -> list[Event]:
    """The events of one change of the row `id_`: an update, an update of n alone (every
    TOASTed column the placeholder), a delete, or a change of its key (Kafka Connect's headers
    {"id":1} on the delete, its tombstone and the create, the TOASTed columns placeholders)."""
    values = _values()
    if kind == "update":
        table[id_] = {"id": id_, **draw(values)}
        return [(id_, _key(id_), _event("u", _sent(table[id_]), lsn), [])]
    if kind == "toast":
        row = table[id_] = {**table[id_], "n": draw(st.integers(-5, 5))}
        return [(id_, _key(id_), _event("u", {**_sent(row), **SENT}, lsn), [])]
    row = table.pop(id_)
    if kind != "rekey":
        return [
            (id_, _key(id_), _event("d", None, lsn, {"id": id_}), []),
            (id_, _key(id_), None, []),
        ]
    new = max([*table, id_]) + 1 + draw(st.integers(0, 2))
    table[new] = {**row, "id": new, "n": draw(st.integers(-5, 5))}
    moved = [(NEW_KEY, json.dumps({"id": new}).encode())]
    came = [(OLD_KEY, json.dumps({"id": id_}).encode())]
    return [
        (id_, _key(id_), _event("d", None, lsn, {"id": id_}), moved),
        (id_, _key(id_), None, moved),
        (new, _key(new), _event("c", {**_sent(table[new]), **SENT}, lsn), came),
    ]


def _values() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "n": st.integers(-5, 5),
            "note": st.none() | st.text("ab", max_size=3),
            "blob": st.none() | st.binary(max_size=3),
            "hs": st.none() | st.just('{"a":"1"}'),
            "tags": st.none() | st.lists(st.text("ab", max_size=2), max_size=2),
            "nums": st.none() | st.lists(st.integers(-3, 3), max_size=2),
        }
    )


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[Event], dict[int, Any]]:
    """Debezium's events of a random history, in order, and the source's table at its end:
    inserts, updates, updates of n alone, deletes, key changes (of a key changed before, too),
    and a connector's restart, which sends again what followed its last offset flush."""
    table: dict[int, dict[str, Any]] = {}
    events: list[Event] = []
    for step in range(draw(st.integers(1, 25))):
        lsn = 10 * (step + 1)
        kind = draw(
            st.sampled_from(["insert", "update", "toast", "delete", "rekey", "rekey", "again"])
        )
        if kind == "again" and events:
            events += events[-draw(st.integers(1, min(6, len(events)))) :]
        elif kind in ("insert", "again") or not table:
            id_ = max(table, default=0) + 1 + draw(st.integers(0, 3))
            table[id_] = {"id": id_, **draw(_values())}
            events.append((id_, _key(id_), _event("c", _sent(table[id_]), lsn), []))
        else:
            events += _changed(draw, table, draw(st.sampled_from(sorted(table))), kind, lsn)
    return events, table


def _records(partition: int, start: int, events: list[Event]) -> pa.RecordBatch:
    """Records as the source's task reads them, with their headers (source.schema)."""
    batch = records(partition, start, [(key, value) for _, key, value, _ in events])
    headers = pa.array(
        [[{"key": k, "value": v} for k, v in each] for *_, each in events], HEADER_TYPE
    )
    return batch.set_column(batch.schema.get_field_index("headers"), "headers", headers)


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
            batch = _records(partition, start, log[partition][start:end])
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
    names = [*(f.name for f in FIELDS), UNKNOWN]
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
        row["id"]: {
            **row,
            "blob": None if row["blob"] is None else bytes(row["blob"]),
            UNKNOWN: set(unknown_columns(row[UNKNOWN])),
        }
        for row in found
    }


def _without_headers(events: list[Event]) -> tuple[list[Event], dict[int, Any]]:
    """The events without their headers, and the table a mirror ends with then (each event in
    its order, by the rules of cdc/key_change.py): a placeholder keeps the column's value, or
    where no row of the key is held it is NULL and marked UNKNOWN (a key change's new row)."""
    table: dict[int, dict[str, Any]] = {}
    for id_, _, value, _ in events:
        payload = None if value is None else json.loads(value)["payload"]
        if payload is None or payload["op"] == "d":
            table.pop(id_, None)
            continue
        held = table.get(id_)
        row = {**payload["after"]}
        row["blob"] = None if row["blob"] is None else base64.b64decode(row["blob"])
        unknown = set()
        for name in TOASTED:
            if payload["after"][name] == SENT[name]:
                row[name] = held[name] if held else None
                if held is None or name in held[UNKNOWN]:
                    unknown.add(name)
        table[id_] = {**row, UNKNOWN: unknown}
    return [(i, k, v, []) for i, k, v, _ in events], table


@pytest.mark.parametrize(
    ("store", "headers"), [("sqlite", True), ("delta", True), ("iceberg", True), ("sqlite", False)]
)
@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    history=histories(),
    cuts=st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 5)).filter(any), min_size=1, max_size=6
    ),
    replays=st.lists(st.integers(0, 12), max_size=3),
)
def test_no_store_ever_holds_the_placeholder(
    tmp_path_factory, store, headers, history, cuts, replays
):
    """Each partition read in batches of its own sizes (a key change's delete and create in
    either order, in one batch or in batches far apart), batches replayed, a connector's
    restart: no table ever holds the placeholder, and the mirror ends equal to the source
    (without headers: to the mirror's rules, the unknown values NULL and marked)."""
    events, source = history
    if headers:
        source = {k: {**row, UNKNOWN: set()} for k, row in source.items()}
    else:
        events, source = _without_headers(events)
    log: dict[int, list[Event]] = {p: [] for p in range(PARTITIONS)}
    for each in events:
        log[each[0] % PARTITIONS].append(each)
    folder: Path = tmp_path_factory.mktemp(store)
    url = f"sqlite:///{folder}/m.db" if store == "sqlite" else f"{store}:///{folder}/lake"
    sink = sink_from_url(url)
    sink.prepare(TARGET)
    batches, positions, step = [], dict.fromkeys(range(PARTITIONS), 0), 0
    # A partition no cut reads is read 5 at a time.
    cuts = [tuple(c[p] or 5 * (not any(d[p] for d in cuts)) for p in range(2)) for c in cuts]
    while any(positions[p] < len(log[p]) for p in positions):
        sizes = cuts[step % len(cuts)]
        ranges = {p: (at, min(len(log[p]), at + sizes[p])) for p, at in positions.items()}
        positions = {p: end for p, (_, end) in ranges.items()}
        batches.append(ranges)
        step += 1
    order = list(range(len(batches)))
    for replay in replays:  # a batch again (the ledger holds it: nothing changes)
        if batches:
            order.insert(min(replay, len(order)), order[min(replay, len(order) - 1)])
    for index in [*order, *range(len(batches))]:
        _upsert(sink, store, folder, index, batches[index], log)
        for row in _mirrored(sink, store).values():
            for name in TOASTED:
                assert row[name] != unavailable_value(FIELDS[name].dataType), (name, row)
    mirrored = _mirrored(sink, store)
    differing = {k: (mirrored.get(k), source.get(k)) for k in {*mirrored, *source}}
    wrong = {k: pair for k, pair in differing.items() if pair[0] != pair[1]}
    assert not wrong, f"(mirror, source) by key: {wrong}"
