"""Typed JSON values parse once (importer/rows.py `_parse_json`): the typed parse, and the
texts' parse only where it failed. Checked against the formula it replaced, both parses on
every value, over values of every kind for every kind of column: the same rejection reason and
the same columns for each."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from lagless.importer import rows
from lagless.sinks.base import Target

SCHEMA = (
    "id BIGINT NOT NULL, n INT, x DOUBLE, ok BOOLEAN, name STRING, day DATE, at TIMESTAMP, "
    "price DECIMAL(6,2), tags ARRAY<STRING>, inner STRUCT<a: INT, b: STRING>, "
    "attrs MAP<STRING, INT>"
)
SCALARS: list[Any] = [
    None, True, False, 0, 7, -3, 2**31, 2**63, 10**30, 1.5, -0.0, 1e300, "", "x", "12",
    "2026-11-24", "2026-11-24T10:00:00Z", "true", "1234.567", "NaN", [], [1, "a"], {},
    {"a": 1, "b": "c"}, {"a": "no"}, {"k": 1}, {"k": "v"},
]  # fmt: skip
NOT_OBJECTS = [b"[1, 2]", b"5", b'"text"', b"null", b"", b"{", b'{"id": 1,', b"\xff\xfe", b"[]"]


def values(count: int, seed: int) -> list[bytes | None]:
    chance = random.Random(seed)
    names = ["id", "n", "x", "ok", "name", "day", "at", "price", "tags", "inner", "attrs"]
    made: list[bytes | None] = [None, *NOT_OBJECTS]
    for _ in range(count):
        document = {"id": chance.randrange(100)} if chance.random() < 0.8 else {}
        for name in chance.sample(names, chance.randrange(len(names))):
            document[name] = chance.choice(SCALARS)
        if chance.random() < 0.05:
            document["unknown"] = chance.choice(SCALARS)
        made.append(json.dumps(document).encode())
    return made


LIMIT = 180  # bytes: a few values are too large, most reach the JSON checks


def two_parses(records: Any, fields: Any) -> Any:
    """The formula `_parse_json` replaced: both parses on every value."""
    from pyspark.sql import functions as F

    text = F.col("value").cast("string")
    corrupt = {"columnNameOfCorruptRecord": rows._CORRUPT}
    return records.withColumns(
        {
            rows._TEXTS: F.from_json(text, rows._as_text(fields), corrupt),
            rows._PARSED: F.from_json(text, fields),
        }
    )


@pytest.mark.parametrize("seed", [1, 2])
def test_one_parse_rejects_and_keeps_what_two_parses_did(spark, monkeypatch, seed: int) -> None:
    from pyspark.sql.types import _parse_datatype_string

    fields = _parse_datatype_string(SCHEMA)
    target = Target("t", "append", "json", fields)
    given = values(400, seed)
    records = spark.createDataFrame(
        [("t", 0, offset, None, value, 0) for offset, value in enumerate(given)],
        "topic STRING, partition INT, offset BIGINT, key BINARY, value BINARY, ts BIGINT",
    ).selectExpr("*", "timestamp_millis(ts) AS timestamp")
    columns = ["offset", rows.ERROR, *fields.names]

    def shaped() -> list[Any]:
        frame = rows.shape(records, target, max_record_bytes=LIMIT)
        return frame.select(*columns).orderBy("offset").collect()

    once = shaped()
    monkeypatch.setattr(rows, "_parse_json", two_parses)
    twice = shaped()

    assert [repr(tuple(row)) for row in once] == [repr(tuple(row)) for row in twice]  # NaN too
    reasons = {row[rows.ERROR] for row in once}
    # The values reach every kind of reason, so the comparison covers each.
    assert {None, rows.NOT_AN_OBJECT, rows.missing("id"), rows.too_large(LIMIT)} <= reasons
    assert sum(1 for r in reasons if r and r.startswith("field ")) >= 5, reasons
