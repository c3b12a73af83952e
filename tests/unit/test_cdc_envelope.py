"""The envelope's rules (lagless/cdc/envelope.py), one by one, and the source histories and
Debezium's events for them that tests/unit/test_change_files.py's property replays through
the whole path (whatever batches, replays and Debezium restarts: the source's table).

The events are written as Debezium 3.6's PostgreSQL connector writes them (Kafka Connect's
JSON with its schema; seen in tests/integration/test_mirror.py)."""

from __future__ import annotations

import base64
import decimal
import json
from typing import Any

import pytest
from hypothesis import strategies as st
from pyspark.sql import types as T

from lagless.cdc.connect_types import UNAVAILABLE
from lagless.cdc.envelope import (
    CDC_COLUMNS,
    DELETED,
    KEY_MISSING,
    NO_AFTER,
    NOT_AN_EVENT,
    NOT_JSON,
    OTHER_OP,
    Envelope,
    evolved,
    split,
)
from lagless.exceptions import SchemaChangeRefused

TOPIC = "db.public.t"
ROW_FIELDS = [
    {"type": "int32", "optional": False, "field": "id"},
    {"type": "string", "optional": True, "field": "name"},
    {"type": "int64", "optional": True, "field": "n"},
    {
        "type": "bytes",
        "optional": True,
        "name": "org.apache.kafka.connect.data.Decimal",
        "version": 1,
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
        "field": "price",
    },
]
FIELDS = T.StructType(
    [
        T.StructField("id", T.IntegerType()),
        T.StructField("name", T.StringType()),
        T.StructField("n", T.LongType()),
        T.StructField("price", T.DecimalType(10, 2)),
    ]
)


def envelope_schema(row_fields: list[dict[str, Any]]) -> dict[str, Any]:
    row = {"type": "struct", "fields": row_fields, "optional": True, "name": "db.public.t.Value"}
    return {
        "type": "struct",
        "fields": [
            {**row, "field": "before"},
            {**row, "field": "after"},
            {
                "type": "struct",
                "fields": [
                    {"type": "int64", "optional": False, "field": "ts_ms"},
                    {"type": "int64", "optional": True, "field": "lsn"},
                ],
                "optional": False,
                "name": "io.debezium.connector.postgresql.Source",
                "field": "source",
            },
            {"type": "string", "optional": False, "field": "op"},
        ],
        "optional": False,
        "name": "db.public.t.Envelope",
    }


def compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def key(id_: int) -> bytes:
    schema = {"type": "struct", "fields": [ROW_FIELDS[0]], "optional": False}
    return compact({"schema": schema, "payload": {"id": id_}})


def price_bytes(price: decimal.Decimal) -> str:
    unscaled = int(price.scaleb(2))
    size = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()


def event(
    op: str,
    after: dict[str, Any] | None,
    before: dict[str, Any] | None = None,
    lsn: int = 1,
    row_fields: list[dict[str, Any]] = ROW_FIELDS,
    table: str = "t",
) -> bytes:
    def wire(row: dict[str, Any] | None) -> dict[str, Any] | None:
        if row is None:
            return None
        shown = dict(row)
        if isinstance(shown.get("price"), decimal.Decimal):
            shown["price"] = price_bytes(shown["price"])
        return shown

    payload = {
        "before": wire(before),
        "after": wire(after),
        "source": {
            "ts_ms": 1_700_000_000_000 + lsn,
            "lsn": lsn,
            "schema": "public",
            "table": table,
        },
        "op": op,
    }
    return compact({"schema": envelope_schema(row_fields), "payload": payload})


def envelope(deletes: str = "hard", cdc: bool = False) -> Envelope:
    fields = FIELDS
    if cdc:
        extra = [
            T.StructField(n, T.StringType() if n == "_op" else T.LongType()) for n in CDC_COLUMNS
        ]
        fields = T.StructType([*fields.fields, *extra])
    if deletes == "soft":
        fields = T.StructType([*fields.fields, T.StructField(DELETED, T.BooleanType())])
    return Envelope(fields, ("id",), deletes)  # type: ignore[arg-type]


ROW = {"id": 7, "name": "a", "n": 3, "price": decimal.Decimal("1.50")}


@pytest.mark.parametrize("op", ["r", "c", "u"])
def test_snapshot_create_and_update_upsert_the_after_row(op):
    change = envelope().change(key(7), event(op, ROW))
    assert change.row == ROW and not change.delete and change.error is None


def test_a_delete_deletes_the_kafka_keys_row():
    change = envelope().change(key(7), event("d", None, before={"id": 7}))
    assert change.delete and change.row == {"id": 7}


def test_the_tombstone_after_a_delete_deletes_the_same_key_again():
    change = envelope().change(key(7), None)
    assert change.delete and change.row == {"id": 7}


def test_soft_deletes_keep_the_row_flagged_and_skip_tombstones():
    soft = envelope("soft", cdc=True)
    change = soft.change(key(7), event("d", None, before={"id": 7}, lsn=9))
    assert change.delete
    assert change.row == {
        "id": 7,
        "_op": "d",
        "_source_ts_ms": 1_700_000_000_009,
        "_lsn": 9,
        DELETED: True,
    }
    assert soft.change(key(7), None).skip
    upserted = soft.change(key(7), event("c", ROW, lsn=10)).row
    assert upserted is not None and upserted[DELETED] is False and upserted["_op"] == "c"


def test_events_without_a_schema_take_the_given_columns():
    payload = {"op": "c", "after": {"id": 1, "name": "x", "n": 2, "price": "AJY="}}
    change = envelope().change(compact({"id": 1}), compact(payload))
    assert change.row == {"id": 1, "name": "x", "n": 2, "price": decimal.Decimal("1.50")}


def test_an_unavailable_toasted_value_comes_through_for_the_store_to_keep():
    change = envelope().change(key(7), event("u", {**ROW, "name": UNAVAILABLE}))
    assert change.row is not None and change.row["name"] == UNAVAILABLE


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"{not json", NOT_JSON),
        (compact({"id": 1}), NOT_AN_EVENT),
        (compact({"op": "t", "after": None}), OTHER_OP),
        (compact({"op": "c", "after": None}), NO_AFTER),
    ],
)
def test_what_is_not_a_change_to_apply_is_rejected_with_its_reason(value, reason):
    assert envelope().change(key(1), value).error == reason


def test_a_delete_without_the_key_fields_is_rejected():
    assert envelope().change(None, event("d", None)).error == KEY_MISSING
    assert envelope().change(None, event("d", None, before={"name": "a"})).error == KEY_MISSING
    # Its tombstone changes nothing: skipped, not rejected.
    assert envelope().change(compact({"other": 1}), None).skip
    assert envelope().change(None, None).skip


def test_a_delete_takes_the_key_fields_the_kafka_key_lacks_from_before():
    """--key-field on a table whose Kafka key lacks it (none: no primary key), under REPLICA
    IDENTITY FULL: `before` holds the whole row, and the key."""
    by_name = Envelope(FIELDS, ("name",), "hard")
    change = by_name.change(None, event("d", None, before={**ROW, "name": "x"}))
    assert change.delete and change.row == {"name": "x"} and change.error is None
    change = by_name.change(key(7), event("d", None, before={**ROW, "name": "y"}))
    assert change.row == {"name": "y"}


def test_a_table_without_a_key_logs_its_deletes():
    """Its change log (key_fields empty): a delete is a row of its own, key or not."""
    log = Envelope(FIELDS, (), "hard", change_log=True)
    assert log.change(None, event("d", None)).row == {}
    assert log.change(None, None).skip


def test_a_payload_field_named_like_the_envelope_still_parses():
    fields = [*ROW_FIELDS, {"type": "string", "optional": True, "field": "payload"}]
    value = event("c", {**ROW, "payload": ',"payload":{}'}, row_fields=fields)
    schema, payload = split(value)
    assert schema is not None and payload["after"]["payload"] == ',"payload":{}'


def test_a_column_added_upstream_is_told_and_added_nullable():
    fields = [*ROW_FIELDS, {"type": "int32", "optional": True, "field": "extra"}]
    change = envelope().change(key(7), event("c", {**ROW, "extra": 5}, row_fields=fields))
    assert change.new_schema is not None and change.row is not None
    assert "extra" not in change.row  # the table lacks it: the batch is written again
    grown = evolved(FIELDS, change.new_schema, "t")
    assert grown.fieldNames() == ["id", "name", "n", "price", "extra"]
    assert grown["extra"].nullable
    assert (
        Envelope(grown, ("id",), "hard")
        .change(key(7), event("c", {**ROW, "extra": 5}, row_fields=fields))
        .new_schema
        is None
    )


def test_a_column_dropped_upstream_stays_null_in_new_rows():
    fields = [f for f in ROW_FIELDS if f["field"] != "n"]
    row = {k: v for k, v in ROW.items() if k != "n"}
    change = envelope().change(key(7), event("c", row, row_fields=fields))
    assert change.new_schema is None and change.row is not None and change.row["n"] is None


def test_a_column_whose_type_changed_is_refused_with_the_true_direction():
    fields = [*ROW_FIELDS[:2], {"type": "string", "optional": True, "field": "n"}, ROW_FIELDS[3]]
    change = envelope().change(key(7), event("c", {**ROW, "n": "3"}, row_fields=fields))
    assert change.new_schema is not None
    told = "column 'n' is bigint in the table, the change events now make it string"
    with pytest.raises(SchemaChangeRefused, match=told) as refused:
        evolved(FIELDS, change.new_schema, "t")
    assert refused.value.table == "t" and "execute-snapshot" in str(refused.value)


def decimal_field(precision: int, scale: int) -> dict[str, Any]:
    return {
        **ROW_FIELDS[3],
        "parameters": {"scale": str(scale), "connect.decimal.precision": str(precision)},
    }


def test_a_widening_widens_the_column_and_an_older_narrower_event_is_stored_in_it():
    """int -> bigint and numeric(10,2) -> numeric(12,4): the table's columns take the wider
    types; an event of the old types (older, or in the same batch) is read into them, exact."""
    narrow = [
        {**ROW_FIELDS[0]},
        ROW_FIELDS[1],
        {"type": "int32", "optional": True, "field": "n"},
        ROW_FIELDS[3],
    ]
    wide = [ROW_FIELDS[0], ROW_FIELDS[1], ROW_FIELDS[2], decimal_field(12, 4)]
    table = T.StructType([*FIELDS.fields[:2], T.StructField("n", T.IntegerType()), FIELDS[3]])
    before = Envelope(table, ("id",), "hard")
    change = before.change(
        key(7), event("c", {**ROW, "price": _unscaled(12345678, 4)}, row_fields=wide)
    )
    assert change.new_schema is not None
    grown = evolved(table, change.new_schema, "t")
    assert [f.dataType for f in grown] == [
        T.IntegerType(),
        T.StringType(),
        T.LongType(),
        T.DecimalType(12, 4),
    ]
    after = Envelope(grown, ("id",), "hard")
    old = after.change(
        key(7), event("c", {**ROW, "n": 3, "price": _unscaled(1250, 2)}, row_fields=narrow)
    )
    assert old.new_schema is None and old.row is not None
    assert (old.row["n"], old.row["price"]) == (3, decimal.Decimal("12.50"))
    new = after.change(
        key(7), event("c", {**ROW, "price": _unscaled(12345678, 4)}, row_fields=wide)
    )
    assert new.new_schema is None and new.row is not None
    assert new.row["price"] == decimal.Decimal("1234.5678")


def _unscaled(value: int, scale: int) -> str:
    return base64.b64encode(value.to_bytes(8, "big", signed=True)).decode()


def test_a_column_added_with_a_default_gives_it_to_events_that_predate_it():
    with_default = {"type": "int32", "optional": True, "default": 7, "field": "d"}
    fields = [*ROW_FIELDS, with_default]
    change = envelope().change(key(7), event("c", {**ROW, "d": 9}, row_fields=fields))
    assert change.new_schema is not None
    grown = evolved(FIELDS, change.new_schema, "t")
    after = Envelope(grown, ("id",), "hard")
    older = after.change(key(8), event("r", {**ROW, "id": 8}))
    assert older.row is not None and older.row["d"] == 7
    newer = after.change(key(9), event("u", {**ROW, "id": 9, "d": None}, row_fields=fields))
    assert newer.row is not None and newer.row["d"] is None  # the source's own NULL


# --- the property: any batches, replays and Debezium restarts give the source's table ---

PARTITIONS = 2


def partition_of(id_: int) -> int:
    return id_ % PARTITIONS


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, int, int | None, dict[str, Any] | None]]:
    """Source operations: (op, id, new id for a key change, row values)."""
    ops = []
    live: set[int] = set()
    next_id = 0
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["insert", "update", "toast", "delete", "rekey"]))
        if kind == "insert" or not live:
            next_id += 1
            live.add(next_id)
            ops.append(("insert", next_id, None, _values(draw)))
            continue
        id_ = draw(st.sampled_from(sorted(live)))
        if kind == "delete":
            live.discard(id_)
            ops.append(("delete", id_, None, None))
        elif kind == "rekey":
            next_id += 1
            live.discard(id_)
            live.add(next_id)
            ops.append(("rekey", id_, next_id, _values(draw)))
        else:
            ops.append((kind, id_, None, _values(draw)))
    return ops


def _values(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "name": draw(st.one_of(st.none(), st.text("ab", max_size=3))),
        "n": draw(st.integers(-5, 5)),
        "price": decimal.Decimal(draw(st.integers(-999, 999))) / 100,
    }


def debezium_events(
    history: list[tuple[str, int, int | None, dict[str, Any] | None]],
) -> tuple[list[tuple[int, bytes, bytes | None]], dict[int, dict[str, Any]]]:
    """The events Debezium sends for the history ((id, key, value) in order), and the source's
    final table."""
    table: dict[int, dict[str, Any]] = {}
    events: list[tuple[int, bytes, bytes | None]] = []
    for lsn, (op, id_, new_id, values) in enumerate(history, start=1):
        if op == "insert":
            assert values is not None
            table[id_] = {"id": id_, **values}
            events.append((id_, key(id_), event("c", table[id_], lsn=lsn)))
        elif op in ("update", "toast"):
            assert values is not None
            row = {**table[id_], **values}
            sent = dict(row)
            if op == "toast":  # the name left alone and TOASTed: Debezium has no value to send
                row["name"] = table[id_]["name"]
                sent["name"] = UNAVAILABLE
            table[id_] = row
            events.append((id_, key(id_), event("u", sent, lsn=lsn)))
        elif op == "delete":
            del table[id_]
            events.append((id_, key(id_), event("d", None, before={"id": id_}, lsn=lsn)))
            events.append((id_, key(id_), None))
        else:
            assert new_id is not None and values is not None
            del table[id_]
            table[new_id] = {"id": new_id, **values}
            events.append((id_, key(id_), event("d", None, before={"id": id_}, lsn=lsn)))
            events.append((id_, key(id_), None))
            events.append((new_id, key(new_id), event("c", table[new_id], lsn=lsn)))
    return events, table


def kafka_log(
    events: list[tuple[int, bytes, bytes | None]], restarts: list[int]
) -> dict[int, list[tuple[bytes, bytes | None]]]:
    """Each partition's records: Debezium sends the events, and after each restart sends
    again every event from a point it had flushed its offsets at (at least once)."""
    sent = list(events)
    for point in restarts:
        sent += events[min(point, len(events)) :]
    log: dict[int, list[tuple[bytes, bytes | None]]] = {p: [] for p in range(PARTITIONS)}
    for id_, k, v in sent:
        log[partition_of(id_)].append((k, v))
    return log
