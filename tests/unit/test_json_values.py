"""Typed JSON values decoded in the source's tasks (source/json_values.py): what is decoded,
and each case left to Spark's from_json (the whole batch's column NULL). That the values
decoded are those from_json gives is checked against Spark itself in
tests/integration/test_json_rejections.py."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lagless.source.json_values import COLUMN, CORRUPT, UNDECIDED_RUN, JsonValues, decodable


def schema(**types: str) -> str:
    fields = [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in types.items()]
    return json.dumps({"type": "struct", "fields": fields})


FIELDS = schema(id="long", n="integer", x="double", ok="boolean", name="string")
PLAIN = b'{"id": 7, "n": 3, "x": 1.5, "ok": true, "name": "a"}'


def test_only_columns_both_parsers_read_alike_are_decodable() -> None:
    assert decodable(FIELDS)
    for other in ("date", "timestamp", "float", "short", "binary", "decimal(6,2)"):
        assert not decodable(schema(id="long", other=other)), other
    assert not decodable(schema(nested={"type": "array"}))  # type: ignore[arg-type]


def test_a_batch_is_decoded_with_its_tombstones_left_null() -> None:
    values = pa.array([PLAIN, None, b'{"id": 8, "other": [1, {"a": null}]}'], pa.binary())
    batch = JsonValues(FIELDS).add_column(pa.RecordBatch.from_arrays([values], ["value"]))
    assert batch.schema.names == ["value", COLUMN]
    assert batch.column(COLUMN).to_pylist() == [
        {"id": 7, "n": 3, "x": 1.5, "ok": True, "name": "a", CORRUPT: None},
        None,
        {"id": 8, "n": None, "x": None, "ok": None, "name": None, CORRUPT: None},
    ]


LEFT_TO_FROM_JSON = [
    b'{"id": "7"}',  # a string for a number (from_json: a wrong type)
    b'{"name": 5}',  # a number for a string (from_json: its text)
    b'{"id": 1.0}',
    b'{"n": 2147483648}',
    b'{"id": 1, "id": 2}',
    b'{"x": NaN}',
    b'{"other": Inf}',  # a spelling Jackson refuses, in a field the schema skips
    b'{"x": 1e400}',
    b'{"id":\n1}',
    b'{"id": 1} {"id": 2}',
    b"   ",
    b"",
    b"[1]",
    b"\xff",
    b'\xef\xbb\xbf{"id": 1}',  # a byte-order mark (from_json: not a JSON object)
    b"{'id': 1}",
    b'{"x": 0.' + b"0" * 1000 + b"1}",  # past Jackson's 1,000 digits
    b'{"other": ' + b"[" * 1000 + b"]" * 1000 + b"}",  # past its nesting depth
    b'{"name": "' + b"x" * 50_001 + b'"}',
]


@pytest.mark.parametrize("odd", LEFT_TO_FROM_JSON, ids=lambda v: repr(v[:24]))
def test_one_odd_value_leaves_its_whole_batch_to_from_json(odd: bytes) -> None:
    values = pa.array([PLAIN, odd, PLAIN], pa.binary())
    batch = JsonValues(FIELDS).add_column(pa.RecordBatch.from_arrays([values], ["value"]))
    assert batch.column(COLUMN).null_count == 3


@pytest.mark.parametrize("odd", [*LEFT_TO_FROM_JSON[:4], b"\xff", b"   "], ids=repr)
def test_in_a_large_batch_only_a_run_around_an_odd_value_is_left_to_from_json(odd: bytes) -> None:
    """A task gathers its reads into large batches: the values away from an odd one are
    still decoded here, each as it is alone."""
    plain = [PLAIN.replace(b"7", str(i).encode()) for i in range(300)]
    texts = [*plain[:137], odd, *plain[137:250], None, *plain[250:]]
    column = JsonValues(FIELDS).decoded(pa.array(texts, pa.binary())).to_pylist()
    left = [i for i, (text, row) in enumerate(zip(texts, column, strict=True)) if text and not row]
    assert 137 in left and len(left) <= UNDECIDED_RUN
    assert column[texts.index(None)] is None
    alone = JsonValues(FIELDS).decode(pa.array(plain, pa.binary()))
    assert alone is not None
    at = [i for i, text in enumerate(texts) if text in plain]  # each plain value's place
    kept = [row for i, row in zip(at, alone.to_pylist(), strict=True) if i not in left]
    assert [row for row in column if row] == kept


def test_a_batch_that_starts_with_a_byte_order_mark_is_left_to_from_json() -> None:
    """pyarrow skips a mark that starts its input, and would store the row from_json refuses:
    stored both as a row and as a dead letter (seen once, as a task's batch began with it)."""
    values = pa.array([b'\xef\xbb\xbf{"id": 1}', PLAIN], pa.binary())
    assert JsonValues(FIELDS).decode(values) is None


def test_a_batch_of_tombstones_only_is_left_null() -> None:
    assert JsonValues(FIELDS).decode(pa.array([None, None], pa.binary())) is None


@given(
    st.lists(
        st.one_of(
            st.none(),
            st.fixed_dictionaries(
                {},
                optional={
                    "id": st.integers(-(2**63), 2**63 - 1),
                    "n": st.integers(-(2**31), 2**31 - 1),
                    "x": st.floats(allow_nan=False, allow_infinity=False),
                    "ok": st.booleans(),
                    "name": st.text(),
                    "other": st.text(),
                },
            ),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_plain_documents_decode_to_their_own_values(documents: list[dict | None]) -> None:
    """JSON written by a JSON library, of the schema's types, decodes to what it holds (a
    batch whose text holds "nan" or "inf" where a value starts is left to from_json)."""
    texts = [None if d is None else json.dumps(d).encode() for d in documents]
    decoded = JsonValues(FIELDS).decode(pa.array(texts, pa.binary()))
    if decoded is None:
        assert all(d is None for d in documents) or any(
            t is not None and (b"nan" in t.lower() or b"inf" in t.lower()) for t in texts
        )
        return
    expected = [
        None
        if d is None
        else {name: d.get(name) for name in ("id", "n", "x", "ok", "name")} | {CORRUPT: None}
        for d in documents
    ]
    assert decoded.to_pylist() == expected
