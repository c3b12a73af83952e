"""Typed JSON values parse once (importer/rows.py `_parse_json`): the typed parse, and the
texts' parse only where it failed. Checked against the formula it replaced, both parses on
every value, over values of every kind for every kind of column: the same rejection reason and
the same columns for each."""

from __future__ import annotations

import json
import logging
import random
import re
import sqlite3
from typing import Any

import pyarrow.parquet as pq
import pytest

from lagless.importer import rows, write_path
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


# Columns the source's tasks decode (source/json_values.py), and values made to find where
# pyarrow's JSON reader and Spark's from_json part: numbers at and past each type's range,
# fractions and exponents in whole-number columns, non-numbers, strings and objects for
# numbers and the reverse, escapes, a key given twice, other spellings JSON does not allow.
DECODED_SCHEMA = "id BIGINT NOT NULL, n INT, x DOUBLE, ok BOOLEAN, name STRING"
ODD_TEXTS = [
    b'{"id": 1, "n": 2147483647}', b'{"id": 1, "n": 2147483648}', b'{"id": 1, "n": -2147483649}',
    b'{"id": 9223372036854775807}', b'{"id": 9223372036854775808}', b'{"id": 1.0}',
    b'{"id": 1e2}', b'{"id": -0}', b'{"id": 01}', b'{"id": +1}', b'{"id": 1, "x": .5}',
    b'{"id": 1, "x": 5.}', b'{"id": 1, "x": 1e400}', b'{"id": 1, "x": 1e-400}',
    b'{"id": 1, "x": 0.1000000000000000055511151231257827}', b'{"id": 1, "x": NaN}',
    b'{"id": 1, "x": -Infinity}', b'{"id": 1, "x": "NaN"}', b'{"id": 1, "u": Inf}',
    b'{"id": 1, "x": 9007199254740993}', b'{"id": 1, "ok": 1}', b'{"id": 1, "ok": "true"}',
    b'{"id": 1, "name": 5}', b'{"id": 1, "name": {"a": 1}}',
    b'{"id": 1, "name": "\\u00e9\\ud83d\\ude00"}', b'{"id": 1, "name": "\\ud800"}',
    b'{"id": 1, "name": "a\\u0000b"}', b'{"id": 1, "name": "tab\tin"}',
    b'{"id": 1, "id": 2}', b"{'id': 1}", b'{id: 1}', b'{"id": 1,}', b'{"id": 1} {"id": 2}',
    b'{"id": 1}{"id": 2}', b'{"id": 1} x', b'{"ID": 1}', b'\xef\xbb\xbf{"id": 1}', b' {"id": 1} ',
    b'{"id": 1, "u": [1, {"v": [true, null]}]}', b'{"id": 1 /* c */}', b'{"id":\n1}', b"   ",
    b'{"id": 1, "name": "info: nan"}', b'{"id": null}', b"{}",
]  # fmt: skip


def decoded_values(count: int, seed: int, odd: float = 0.15) -> list[bytes | None]:
    """Documents of DECODED_SCHEMA's fields, most of them plain (so that whole batches
    decode), a share `odd` of them odd."""
    chance = random.Random(seed)
    made: list[bytes | None] = []
    for _ in range(count):
        if chance.random() < odd:
            made.append(chance.choice([*ODD_TEXTS, None]))
            continue
        document: dict[str, Any] = {"id": chance.randrange(-(2**63), 2**63)}
        if chance.random() < 0.5:
            document["n"] = chance.randrange(-(2**31), 2**31)
        if chance.random() < 0.5:
            document["x"] = chance.choice([chance.uniform(-1e9, 1e9), chance.random() * 1e-300])
        if chance.random() < 0.5:
            document["ok"] = chance.random() < 0.5
        if chance.random() < 0.5:
            document["name"] = "".join(chance.choice('aé😀"\\/ x') for _ in range(8))
        made.append(json.dumps(document, ensure_ascii=chance.random() < 0.5).encode())
    return made


@pytest.mark.parametrize("seed", [1, 2])
def test_values_the_tasks_decode_are_those_from_json_gives(spark, seed: int) -> None:
    """Values decoded in the source's tasks (the column json_values.COLUMN, NULL for a batch
    it leaves to from_json) give the same rows and the same rejection reasons as from_json
    alone, batch by batch, odd values among them."""
    import pyarrow as pa
    from pyspark.sql.types import _parse_datatype_string

    from lagless.source import json_values

    fields = _parse_datatype_string(DECODED_SCHEMA)
    assert json_values.decodable(fields.json())
    target = Target("t", "append", "json", fields)
    given = decoded_values(600, seed)
    decoder = json_values.JsonValues(fields.json())
    decoded, batches_decoded = [], 0
    for start in range(0, len(given), 8):  # batches of 8: some with an odd value, some not
        values = pa.array(given[start : start + 8], pa.binary())
        column = decoder.add_column(pa.RecordBatch.from_arrays([values], ["value"]))
        decoded.append(column.column(json_values.COLUMN))
        batches_decoded += column.column(json_values.COLUMN).null_count < len(values)
    table = pa.table(
        {
            "topic": ["t"] * len(given),
            "partition": pa.array([0] * len(given), pa.int32()),
            "offset": pa.array(range(len(given)), pa.int64()),
            "key": pa.nulls(len(given), pa.binary()),
            "value": pa.array(given, pa.binary()),
            "ts": pa.array([0] * len(given), pa.int64()),
            json_values.COLUMN: pa.concat_arrays(decoded),
        }
    )
    records = spark.createDataFrame(table).selectExpr("*", "timestamp_millis(ts) AS timestamp")
    columns = ["offset", rows.ERROR, *fields.names]

    def shaped(frame: Any) -> list[Any]:
        out = rows.shape(frame, target, max_record_bytes=LIMIT)
        return out.select(*columns).orderBy("offset").collect()

    with_decoded = shaped(records)
    from_json_alone = shaped(records.drop(json_values.COLUMN))

    assert [repr(tuple(r)) for r in with_decoded] == [repr(tuple(r)) for r in from_json_alone]
    # Not vacuous: many batches were decoded in the tasks, and some were left to from_json.
    assert 20 <= batches_decoded < len(decoded), batches_decoded
    assert {row[rows.ERROR] for row in with_decoded} > {None}


def produce_plain_and_mixed(broker: Any, kafka: Any, topic: str, seed: int) -> list[Any]:
    """1,500 values into each of the topic's 2 partitions: partition 0's all plain (its
    batches decode in the tasks), partition 1's with a sixth odd; returns them in order."""
    from confluent_kafka import Producer

    broker.create_topic(topic, 2)
    producer = Producer(kafka.producer())
    given = decoded_values(1500, seed=seed, odd=0) + decoded_values(1500, seed + 1, odd=0.15)
    for index, value in enumerate(given):
        producer.produce(topic, value, str(index % 50).encode(), partition=index // 1500)
    assert producer.flush(30) == 0
    return given


def test_an_import_decoding_in_its_tasks_stores_what_from_json_alone_stores(
    broker, kafka, topic_name, tmp_path, spark, monkeypatch
) -> None:
    """Through the whole import (the source's option, its tasks, the batch writer, SQLite):
    plain values decoded in the tasks, batches with an odd value left to from_json, and the
    same rows and dead letters as an import where from_json decodes every value."""
    from lagless.importer.job import run_import
    from lagless.importer.plan import ImportPlan
    from lagless.importer.spec import ImportSpec

    given = produce_plain_and_mixed(broker, kafka, topic_name, seed=3)
    tasks_log = tmp_path / "tasks.log"

    def imported(name: str) -> tuple[list[Any], list[Any]]:
        spec = ImportSpec(
            kafka=kafka,
            topics=(topic_name,),
            sink_url=f"sqlite:///{tmp_path}/{name}.db",
            checkpoint=str(tmp_path / name),
            value_format="json",
            value_schema=DECODED_SCHEMA,
            max_record_bytes=LIMIT,
            extra_source_options={
                "logTo": json.dumps({"level": "debug", "file": str(tasks_log), "json": False})
            },
        )
        summary = run_import(spec, spark=spark)
        assert summary.records == len(given)
        with sqlite3.connect(tmp_path / f"{name}.db") as db:
            stored = db.execute(f'SELECT * FROM "{topic_name}" ORDER BY 2, 3').fetchall()
            dead = db.execute(f'SELECT * FROM "{topic_name}_dlq" ORDER BY 2, 3').fetchall()
        return stored, dead

    decoded_in_tasks = imported("tasks")
    told = re.findall(r"(\d+) values decoded in the task, (\d+) left", tasks_log.read_text())
    monkeypatch.setattr(ImportPlan, "json_fields_tasks_decode", property(lambda self: None))
    by_from_json = imported("from_json")

    assert decoded_in_tasks == by_from_json
    stored, dead = decoded_in_tasks
    assert len(stored) > 2000 and len(dead) > 50  # both kinds of record reached the store
    assert sum(int(d) for d, _ in told) > 1000 and sum(int(n) for _, n in told) > 0, told


TYPED_COLUMNS = ("topic", "partition", "offset", "key", "timestamp", "id", "n", "x", "ok", "name")


@pytest.mark.parametrize(
    "store",
    [
        "parquet",
        "sqlite",
        *(pytest.param(s, marks=pytest.mark.matrix) for s in ("delta", "iceberg", "parquet+s3")),
    ],
)
def test_a_typed_import_the_tasks_write_stores_what_spark_rows_store(
    broker, kafka, topic_name, tmp_path, spark, monkeypatch, request, caplog, store: str
) -> None:
    """Typed JSON into a folder store or SQLite: the source's tasks write the rows of the
    values they decode and leave the others (odd values, missing required fields, in whole
    batches) to Spark's rows, all committed as one batch. The same table, the same dead
    letters and the same column types as an import whose rows all come through Spark."""
    from lagless.importer.job import run_import
    from lagless.importer.spec import ImportSpec
    from lagless.sinks.base import DEAD_LETTER_COLUMNS
    from tests.integration.test_crash_safety import sink_url, stored

    given = produce_plain_and_mixed(broker, kafka, topic_name, seed=5)
    tasks_log = tmp_path / "import.log"
    types: list[tuple[tuple[str, str], ...]] = []

    def imported(name: str) -> tuple[Any, ...]:
        folder = tmp_path / name
        folder.mkdir()
        url = sink_url(store, folder, request)
        spec = ImportSpec(
            kafka=kafka,
            topics=(topic_name,),
            sink_url=url,
            checkpoint=str(folder / "ckpt"),
            value_format="json",
            value_schema=DECODED_SCHEMA,
            extra_source_options={
                "logTo": json.dumps({"level": "debug", "file": str(tasks_log), "json": False})
            },
        )
        summary = run_import(spec, spark=spark)
        table = stored(url, topic_name, TYPED_COLUMNS)
        dead = stored(url, f"{topic_name}_dlq", DEAD_LETTER_COLUMNS)
        if store in ("parquet", "delta", "iceberg"):  # every file, the same column types
            files = [
                path
                for path in folder.rglob("*.parquet")
                if f"/{topic_name}/" in str(path) and "/_" not in str(path)
            ]
            schemas = {tuple((f.name, str(f.type)) for f in pq.read_schema(p)) for p in files}
            assert len(schemas) == 1, schemas
            types.append(schemas.pop())
        counts = (
            summary.records,
            summary.imported,
            summary.written,
            summary.bytes,
            dict(summary.dead_lettered_by_reason),
        )
        return counts, [repr(row) for row in table], [repr(row) for row in dead]

    with caplog.at_level(logging.INFO, "lagless.importer.batch_writer"):
        by_tasks = imported("tasks")
    told = tasks_log.read_text()
    tasks_log.unlink()
    monkeypatch.setattr(write_path, "table_writer", lambda options, sink, target: None)
    by_rows = imported("rows")

    assert by_tasks == by_rows
    assert len(types) == (2 if store in ("parquet", "delta", "iceberg") else 0), types
    assert len(set(types)) <= 1, types
    (records, imported_rows, *_), table, dead_letters = by_tasks
    assert len(table) == imported_rows
    assert records == len(given) and imported_rows > 2000 and len(dead_letters) > 50
    # Not vacuous: the tasks wrote partition 0's rows, and left partition 1's to Spark's rows.
    decoded = sum(int(n) for n in re.findall(r"(\d+) values decoded in the task", told))
    assert decoded >= 1500, told[-2000:]
    assert "files of records left to Spark's rows" in caplog.text
