"""The import into a real PostgreSQL server started by the test run."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from lagless.gen import explicit, produce_profile
from lagless.importer.job import run_import
from lagless.importer.plan import source_options
from lagless.importer.spec import ImportSpec
from lagless.kafka.config import KafkaConfig
from tests.harness.plans import offline_plan, tasks_writer

pytestmark = pytest.mark.spark


def pg_spec(kafka: KafkaConfig, topic: str, url: str, tmp_path: Path, **kw: object) -> ImportSpec:
    return ImportSpec(
        kafka=kafka, topics=(topic,), sink_url=url, checkpoint=str(tmp_path / "ckpt"), **kw
    )  # type: ignore[arg-type]


def rows(url: str, sql: str) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql).fetchall()


def test_append_and_dead_letters_land_exactly_once(
    broker, kafka, topic_name, tmp_path, spark, postgres
):
    broker.create_topic(topic_name, 3)
    produced = produce_profile(kafka, topic_name, explicit([1500, 10, 900]), keys=30, poison=0.05)

    summary = run_import(
        pg_spec(kafka, topic_name, postgres.url, tmp_path, value_format="json"), spark=spark
    )

    stored = rows(postgres.url, f'SELECT "partition", "offset" FROM {topic_name}')
    letters = rows(postgres.url, f'SELECT "partition", "offset", error FROM {topic_name}_dlq')
    invalid = {(p, o) for p, o, kind in produced.poison if kind != "null-key"}
    everything = {(p, o) for p, (a, b) in produced.offsets.items() for o in range(a, b)}
    assert len(stored) == len(set(stored))
    assert set(stored) == everything - invalid
    assert {(p, o) for p, o, _ in letters} == invalid
    assert summary.imported + summary.dead_lettered == summary.records == produced.records


def test_a_password_with_url_characters_reaches_both_clients(
    broker, kafka, topic_name, tmp_path, spark, postgres
):
    """The password percent-encoded in the URL, as it must be: psycopg (checks, merges) and
    ADBC (the tasks' COPY, the driver's ingest) both log in with it, decoded once."""
    password = "p@ss%w:rd/1"
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS odd_user")
        conn.execute(f"CREATE ROLE odd_user LOGIN PASSWORD '{password}'")
        conn.execute("GRANT CREATE, USAGE ON SCHEMA public TO odd_user")
    url = postgres.url.replace("lagless:secret-pw", f"odd_user:{quote(password, safe='')}")
    broker.create_topic(topic_name, 2)
    produced = produce_profile(kafka, topic_name, explicit([300, 200]), keys=20)

    # Raw appends: the reading tasks COPY through ADBC with the URI the sink gives them.
    tasks = run_import(pg_spec(kafka, topic_name, url, tmp_path / "tasks"), spark=spark)
    # Through the driver: psycopg checks, ADBC ingests on the driver.
    driver = run_import(
        pg_spec(
            kafka, topic_name, f"{url}?write_from=driver", tmp_path / "driver", table="by_driver"
        ),
        spark=spark,
    )

    assert tasks.imported == driver.imported == produced.records
    owners = rows(
        postgres.url,
        "SELECT tablename, tableowner FROM pg_tables "
        f"WHERE tablename IN ('{topic_name}', 'by_driver') ORDER BY tablename",
    )
    assert owners == sorted([(topic_name, "odd_user"), ("by_driver", "odd_user")])
    assert rows(url, f'SELECT count(*) FROM "{topic_name}"') == [(produced.records,)]


def test_upsert_keeps_newest_per_key(broker, kafka, topic_name, tmp_path, spark, postgres):
    broker.create_topic(topic_name, 2)
    produced = produce_profile(kafka, topic_name, explicit([3000, 2000]), keys=5)

    summary = run_import(
        pg_spec(kafka, topic_name, postgres.url, tmp_path, write="upsert"), spark=spark
    )

    stored = rows(postgres.url, f'SELECT key, "partition", "offset" FROM {topic_name}')
    newest = produced.newest_by_key()
    assert {bytes(k).decode(): (p, o) for k, p, o in stored} == {
        k: (n.partition, n.offset) for k, n in newest.items()
    }
    assert summary.records == 5000 and summary.written == len(newest) == 10


def test_server_stopped_and_restarted_mid_import_loses_and_doubles_nothing(
    broker, kafka, topic_name, tmp_path, spark, postgres
):
    broker.create_topic(topic_name, 2)
    produced = produce_profile(kafka, topic_name, explicit([4000, 4000]), keys=50)
    spec = pg_spec(kafka, topic_name, postgres.url, tmp_path, max_records_per_batch=1000)

    def bounce() -> None:
        time.sleep(4)
        postgres.stop()
        time.sleep(4)
        postgres.start()

    bouncer = threading.Thread(target=bounce)
    bouncer.start()
    try:
        summary = run_import(spec, spark=spark)
    finally:
        bouncer.join()

    stored = rows(postgres.url, f'SELECT "partition", "offset" FROM {topic_name}')
    assert len(stored) == len(set(stored)) == produced.records == summary.records
    assert summary.batches == 8


def test_bad_password_is_one_line_and_never_shows_the_password(
    broker, topic_name, tmp_path, postgres
):
    broker.create_topic(topic_name, 1)
    url = postgres.url.replace("secret-pw", "wrong-Pa55")
    args = ["--bootstrap", broker.bootstrap, "--topic", topic_name, "--sink", url]
    result = subprocess.run(
        [sys.executable, "-m", "lagless", "import", *args, "--checkpoint", str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "wrong-Pa55" not in result.stderr and "****" in result.stderr
    assert not (tmp_path / "ckpt").exists()


def refused_import(bootstrap: str, topic: str, url: str, tmp_path: Path, *extra: str) -> str:
    """`lagless import` that must refuse: exit 2, one line (returned), nothing written."""
    args = ["--bootstrap", bootstrap, "--topic", topic, "--sink", url, *extra]
    result = subprocess.run(
        [sys.executable, "-m", "lagless", "import", *args, "--checkpoint", str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert not (tmp_path / "ckpt").exists()
    assert rows(url, f'SELECT count(*) FROM "{topic}"') == [(0,)]
    return lines[0]


def test_append_table_reused_for_upsert_is_one_line_and_writes_nothing(
    broker, topic_name, tmp_path, postgres
):
    from lagless.sinks import Target, sink_from_url

    broker.create_topic(topic_name, 1)
    sink_from_url(postgres.url).prepare(Target(topic_name, "append", "raw"))
    line = refused_import(broker.bootstrap, topic_name, postgres.url, tmp_path, "--write", "upsert")
    assert "unique on topic, partition, offset" in line


def test_json_values_are_jsonb_and_a_replayed_append_doubles_nothing(
    broker, kafka, topic_name, tmp_path, spark, postgres
):
    """JSON without a schema goes through the stage (binary COPY cannot write Arrow text into
    jsonb). A rerun from a fresh checkpoint reads nothing (the table's ledger holds it all);
    with the ledger emptied too, it replays every batch and must change nothing."""
    from tests.integration.test_crash_safety import read_topic

    broker.create_topic(topic_name, 2)
    produce_profile(kafka, topic_name, explicit([700, 300]), keys=20, poison=0.04)
    records = read_topic(kafka, topic_name, 2)
    spec = pg_spec(
        kafka, topic_name, postgres.url, tmp_path, value_format="json", max_records_per_batch=400
    )

    first = run_import(spec, spark=spark)
    fresh = run_import(replace(spec, checkpoint=str(tmp_path / "ckpt-fresh")), spark=spark)
    with psycopg.connect(postgres.url) as conn:
        conn.execute(f'DELETE FROM "{topic_name}_ledger"')
    replay = run_import(replace(spec, checkpoint=str(tmp_path / "ckpt-replay")), spark=spark)

    assert rows(
        postgres.url,
        "SELECT data_type FROM information_schema.columns "
        f"WHERE table_name = '{topic_name}' AND column_name = 'value'",
    ) == [("jsonb",)]
    stored = rows(postgres.url, f'SELECT "partition", "offset", value FROM {topic_name}')
    expected = {}
    for record in records:
        try:
            expected[(record.partition, record.offset)] = json.loads(record.value.decode())
        except ValueError:  # poison: not UTF-8 or not JSON, dead-lettered
            continue
    assert len(stored) == len(expected) == first.imported == replay.imported
    assert {(p, o): value for p, o, value in stored} == expected
    assert first.written == len(expected) and replay.written == 0
    assert fresh.records == 0


def test_raw_records_copied_by_the_reading_tasks_land_once_even_when_replayed(
    broker, kafka, topic_name, tmp_path, spark, postgres
):
    """Raw appends are COPYed by the source's tasks themselves (its executorWriter), with the
    connection's password in an option Spark redacts. A rerun from a fresh checkpoint after
    rows went missing, and the ledger with them, replays every batch: tasks that find their
    records there merge, those that find none COPY, and the table ends with each record once."""
    from lagless.source import SOURCE_NAME
    from tests.integration.test_crash_safety import read_topic

    broker.create_topic(topic_name, 3)
    produce_profile(kafka, topic_name, explicit([900, 400, 700]), keys=20)
    records = read_topic(kafka, topic_name, 3)
    spec = pg_spec(kafka, topic_name, postgres.url, tmp_path, max_records_per_batch=500)
    assert tasks_writer(spec) is not None  # the path under test

    options = source_options(offline_plan(spec), slots=2)
    plan = spark.readStream.format(SOURCE_NAME).options(**options).load()
    assert "secret-pw" in options["executorWriterSecret"]
    assert "secret-pw" not in plan._jdf.queryExecution().toString()

    first = run_import(spec, spark=spark)
    with psycopg.connect(postgres.url) as conn:
        conn.execute(f'DELETE FROM {topic_name} WHERE "partition" = 1 OR "offset" % 3 = 0')
        conn.execute(f'DELETE FROM "{topic_name}_ledger"')
    run_import(replace(spec, checkpoint=str(tmp_path / "ckpt-replay")), spark=spark)

    stored = rows(postgres.url, f'SELECT "partition", "offset", key, value FROM {topic_name}')
    assert first.imported == len(records)
    assert sorted((p, o, bytes(k), bytes(v)) for p, o, k, v in stored) == sorted(
        (r.partition, r.offset, r.key, r.value) for r in records
    )


def test_a_table_with_json_values_as_text_is_one_line_and_writes_nothing(
    broker, kafka, topic_name, tmp_path, postgres
):
    """A table an earlier lagless made, JSON values in a text column: the import says how to
    convert it rather than mixing text and jsonb."""
    broker.create_topic(topic_name, 1)
    produce_profile(kafka, topic_name, explicit([20]), keys=5)
    with psycopg.connect(postgres.url) as conn:
        conn.execute(
            f'CREATE TABLE "{topic_name}" ("topic" text NOT NULL, "partition" integer NOT NULL, '
            '"offset" bigint NOT NULL, "key" bytea, "value" text, "timestamp" bigint, '
            'PRIMARY KEY ("topic", "partition", "offset"))'
        )

    line = refused_import(
        broker.bootstrap, topic_name, postgres.url, tmp_path, "--value-format", "json"
    )

    assert "TYPE jsonb USING" in line
