"""A primary-key change's events as the mirror reads them (lagless/cdc/key_change.py): its
delete and its create give one id, from either of Kafka Connect's header converters; records
without the headers give none, and a batch of them is not parsed at all."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from lagless.cdc.key_change import (
    NEW_KEY,
    OLD_KEY,
    change_id,
    marked,
    of_event,
    of_records,
    unknown_columns,
)
from lagless.source.schema import HEADER_TYPE
from tests.unit.test_cdc_envelope import compact

KEY_SCHEMA = {"type": "struct", "fields": [{"type": "int32", "field": "id"}], "name": "t.Key"}


def key(id_: int, schema: bool = True) -> bytes:
    payload = {"id": id_}
    return compact({"schema": KEY_SCHEMA, "payload": payload} if schema else payload)


def event(op: str, source: dict | None) -> bytes:
    payload = {"before": None, "after": {"id": 1}, "op": op, "source": source}
    return compact({"schema": {"type": "struct", "fields": []}, "payload": payload})


# SimpleHeaderConverter's text (Kafka Connect's default), JsonConverter's with and without
# its schema.
FORMS = [
    lambda id_: f'{{"id":{id_}}}'.encode(),
    lambda id_: key(id_),
    lambda id_: key(id_, schema=False),
]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("source", [{"lsn": 26413160, "txId": 730, "ts_ms": 1}, None])
def test_the_delete_and_the_create_give_one_id(form, source):
    moves, none = of_event(key(1), event("d", source), [(NEW_KEY, form(1001))])
    nothing, takes = of_event(key(1001), event("c", source), [(OLD_KEY, form(1))])
    assert moves is not None and moves == takes and none is None and nothing is None
    if source is None:  # by the two keys
        other, _ = of_event(key(2), event("d", source), [(NEW_KEY, form(1001))])
        assert other != moves


def test_the_place_alone_names_a_change_the_keys_need_not_match():
    """Each converter writes the keys its own way (a decimal key as text or base64): the
    database's position is the id wherever the events carry one."""
    place = {"lsn": 5, "txId": 2, "ts_ms": 9, "snapshot": "false"}
    assert change_id(place, {"id": "12.5"}, {"id": 1}) == change_id(place, "MTI1", [1])
    assert change_id(place, 1, 2) != change_id({**place, "lsn": 6}, 1, 2)


def test_other_records_begin_or_take_none():
    context = [("__debezium.context.taskId", b"0")]
    assert of_event(key(1), event("u", None), context) == (None, None)
    assert of_event(key(1), None, [(NEW_KEY, b'{"id":2}')]) == (None, None)  # its tombstone
    assert of_event(key(1), event("u", None), [(OLD_KEY, b'{"id":2}')]) == (None, None)
    assert of_event(key(1), b"not json", [(NEW_KEY, b'{"id":2}')]) == (None, None)


def test_a_batch_without_a_key_changes_header_is_not_parsed():
    keys = pa.array([key(1), key(2)], pa.binary())
    values = pa.array([b"never parsed", None], pa.binary())
    context = [{"key": "__debezium.context.taskId", "value": b"0"}]
    assert of_records(keys, values, pa.array([context, None], HEADER_TYPE)) is None
    assert of_records(keys, values, None) is None
    changed = pa.array([event("d", {"lsn": 7}), None], pa.binary())
    headers = pa.array([[{"key": NEW_KEY, "value": b'{"id":3}'}], None], HEADER_TYPE)
    moves, takes = of_records(keys, changed, headers)  # type: ignore[misc]
    assert moves.to_pylist() == [json.dumps({"lsn": 7}, separators=(",", ":")), None]
    assert takes.to_pylist() == [None, None]


def test_a_mark_names_its_columns():
    assert marked([]) is None
    assert marked(["body", "tags"]) == '["body","tags"]'
    assert unknown_columns(marked(["body", "tags"])) == ["body", "tags"]
    assert unknown_columns(None) == []
