"""Many topics into many tables in one import (issue 30, point 3): `--topic-pattern` and
`--table` templates, one Spark query and one checkpoint, each table with its own ledger.

Expected rows come from what the producer says it wrote (gen.produce_profile), never from
another lagless run; the tables are read with the stores' own readers."""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lagless.gen import ProducedSummary, explicit, produce_profile
from lagless.importer.checkpoint import journaled_batches, last_end_offsets, read_fit
from lagless.importer.job import run_import
from lagless.importer.plan import check
from lagless.importer.spec import ImportSpec
from lagless.source.executor_write import ROUTED_WRITER
from tests.harness import sqlite_elsewhere

pytestmark = pytest.mark.spark

TIMEOUT_S = 240


def offsets(summary: ProducedSummary) -> list[tuple[int, int]]:
    """Every (partition, offset) the producer wrote, once each, sorted."""
    return sorted((p, o) for p, (start, end) in summary.offsets.items() for o in range(start, end))


def sqlite_rows(path: Path, table: str) -> list[tuple[int, int]]:
    """(partition, offset) of every row, duplicates kept; read from another process (an
    import may be running in this one: sqlite_elsewhere.py)."""
    return sorted(sqlite_elsewhere.rows(path, f'SELECT partition, "offset" FROM "{table}"'))


def sqlite_tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def delta_rows(folder: Path) -> list[tuple[int, int]]:
    from deltalake import DeltaTable

    data = DeltaTable(str(folder)).to_pyarrow_table(columns=["partition", "offset"]).to_pylist()
    return sorted((row["partition"], row["offset"]) for row in data)


def lagless_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lagless", "import", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def test_a_pattern_imports_three_topics_into_three_sqlite_tables_by_the_cli(
    broker, kafka, tmp_path, spark
):
    """--explain lists the tables; one run fills each (JSON values: Spark's rows, split by
    table in each batch); a rerun adds nothing; the one checkpoint holds every topic."""
    layout = {
        "shop.sales.orders": [300, 120],
        "shop.sales.users": [90],
        "shop.ops.items": [5, 0, 60],
    }
    produced = {}
    for topic, counts in layout.items():
        broker.create_topic(topic, len(counts))
        produced[topic] = produce_profile(kafka, topic, explicit(counts), keys=7, seed=len(topic))
    broker.create_topic("shop_audit", 1)  # does not match: not imported
    produce_profile(kafka, "shop_audit", explicit([40]), keys=3)
    db = tmp_path / "mirror.db"
    args = [
        *("--bootstrap", broker.bootstrap, "--topic-pattern", r"shop\.\w+\.\w+"),
        *("--table", "{schema}_{table}", "--format", "json"),
        *("--sink", f"sqlite:///{db}", "--checkpoint", str(tmp_path / "ckpt")),
        *("--max-records-per-batch", "200"),
    ]

    explained = lagless_cli(*args, "--explain", "--json")

    assert explained.returncode == 0, explained.stderr
    plan = json.loads(explained.stdout)
    assert {t["table"]: t["topics"] for t in plan["tables"]} == {
        "ops_items": ["shop.ops.items"],
        "sales_orders": ["shop.sales.orders"],
        "sales_users": ["shop.sales.users"],
    }
    assert sum(t["records"] for t in plan["tables"]) == 200  # the first batch's
    assert all(p["table"] for task in plan["tasks"] for p in task["pieces"])
    assert not db.exists()  # --explain writes nothing

    result = lagless_cli(*args, "--json")

    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    tables = {"sales_orders": "shop.sales.orders", "sales_users": "shop.sales.users",
              "ops_items": "shop.ops.items"}  # fmt: skip
    for table, topic in tables.items():
        assert sqlite_rows(db, table) == offsets(produced[topic]), table
    assert "shop_audit" not in sqlite_tables(db)
    assert summary["records"] == sum(p.records for p in produced.values()) == 575
    assert summary["batches"] >= 3  # batches of 200: several tables in one batch
    fit = read_fit(str(tmp_path / "ckpt"))
    assert (fit.pattern, fit.table) == (r"shop\.\w+\.\w+", "{schema}_{table}")
    assert {t for t, _ in last_end_offsets(str(tmp_path / "ckpt"))} == set(tables.values())

    spec = ImportSpec(
        kafka=kafka,
        topics=(),
        topic_pattern=r"shop\.\w+\.\w+",
        table="{schema}_{table}",
        value_format="json",
        sink_url=f"sqlite:///{db}",
        checkpoint=str(tmp_path / "ckpt"),
    )
    again = run_import(spec, spark=spark)

    assert again.records == 0
    for table, topic in tables.items():
        assert sqlite_rows(db, table) == offsets(produced[topic]), table


@pytest.mark.matrix  # CI: the tasks' routed writes by the continuous case, Delta's ledger per
# table by tests/unit/test_ledger_stores.py's property
def test_a_pattern_imports_three_topics_into_three_delta_tables_the_tasks_write(
    broker, kafka, tmp_path, spark
):
    """Raw values through the CLI: the source's tasks write the files, a task one topic's,
    each table's files committed with its own ranges. Then the same topics named with
    --topic on a fresh checkpoint add nothing: each table's ledger decides."""
    layout = {"lake.clicks": [700, 250], "lake.views": [400], "lake.carts": [30, 30, 30]}
    produced = {}
    for topic, counts in layout.items():
        broker.create_topic(topic, len(counts))
        produced[topic] = produce_profile(kafka, topic, explicit(counts), keys=11, seed=len(topic))
    url = f"delta:///{tmp_path}/lake"
    args = [
        *("--bootstrap", broker.bootstrap, "--topic-pattern", r"lake\..*", "--table", "t_{topic}"),
        *("--sink", url, "--checkpoint", str(tmp_path / "ckpt"), "--json"),
        *("--max-records-per-batch", "500"),
    ]

    result = lagless_cli(*args)

    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    for topic in layout:
        folder = tmp_path / "lake" / f"t_{topic.replace('.', '_')}"
        assert delta_rows(folder) == offsets(produced[topic]), topic
    assert summary["records"] == sum(p.records for p in produced.values())
    assert len(journaled_batches(str(tmp_path / "ckpt"))) == summary["batches"] >= 3

    named = ImportSpec(
        kafka=kafka,
        topics=tuple(layout),
        table="t_{topic}",
        sink_url=url,
        checkpoint=str(tmp_path / "fresh"),
    )
    plan = check(named)
    plan.reader.close()
    writer = plan.write_path.writer
    assert writer is not None and writer.name == ROUTED_WRITER  # the path under test
    fresh = run_import(named, spark=spark)

    assert fresh.records == 0
    for topic in layout:
        folder = tmp_path / "lake" / f"t_{topic.replace('.', '_')}"
        assert delta_rows(folder) == offsets(produced[topic]), topic


def test_a_topic_created_while_a_continuous_import_runs_gets_its_table(
    broker, kafka, tmp_path, spark, caplog
):
    """Raw values into SQLite (the tasks write them): the new topic's table is prepared and
    the query started again on the same checkpoint before its first records are written."""
    db = tmp_path / "feeds.db"
    broker.create_topic("feed.a", 2)
    first = produce_profile(kafka, "feed.a", explicit([100, 80]), keys=5)
    later: dict[str, ProducedSummary] = {}
    failure: list[BaseException] = []

    def wait_for(table: str, count: int) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if len(sqlite_rows(db, table)) >= count:
                    return
            except sqlite3.OperationalError:
                pass  # not created yet, or locked by the writer
            time.sleep(0.3)
        raise AssertionError(f"{table} never reached {count} rows")

    def new_topic_then_interrupt() -> None:
        try:
            wait_for("feed_a", 180)
            broker.create_topic("feed.b", 3)
            later["feed.b"] = produce_profile(kafka, "feed.b", explicit([50, 0, 70]), keys=5)
            wait_for("feed_b", 120)
            later["feed.a"] = produce_profile(kafka, "feed.a", explicit([10, 10]), keys=5, seed=1)
            wait_for("feed_a", 200)
        except BaseException as exc:
            failure.append(exc)
        finally:
            os.kill(os.getpid(), signal.SIGINT)

    helper = threading.Thread(target=new_topic_then_interrupt)
    helper.start()
    spec = ImportSpec(
        kafka=kafka,
        topics=(),
        topic_pattern=r"feed\..*",
        sink_url=f"sqlite:///{db}",
        checkpoint=str(tmp_path / "ckpt"),
        mode="continuous",
        trigger_seconds=0.5,
    )
    with caplog.at_level(logging.INFO, logger="lagless.importer.job"):
        summary = run_import(spec, spark=spark)
    helper.join()

    assert not failure, failure
    assert "new topics feed.b: their tables are ready" in caplog.text
    assert sqlite_rows(db, "feed_a") == sorted(offsets(first) + offsets(later["feed.a"]))
    assert sqlite_rows(db, "feed_b") == offsets(later["feed.b"])
    assert summary.records == 320
    assert {t for t, _ in last_end_offsets(spec.checkpoint)} == {"feed.a", "feed.b"}


USER_AVRO = {
    "type": "record",
    "name": "User",
    "fields": [{"name": "email", "type": "string"}, {"name": "age", "type": ["null", "int"]}],
}


@pytest.mark.matrix
def test_avro_topics_each_with_its_registry_subject_land_in_tables_of_their_own_columns(
    broker, kafka, tmp_path, spark
):
    """Avro: each table's columns come from its own topic's subject `<topic>-value`; the
    tasks cannot decode two schemas in one query, so the rows come through Spark's."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    from tests.harness.schema_registry import SchemaRegistry
    from tests.integration.test_typed_tables import DEAL_AVRO, avro_body, avro_deal, produce

    broker.create_topic("app.deals", 2)
    broker.create_topic("app.users", 1)
    with SchemaRegistry() as registry:
        client = SchemaRegistryClient({"url": registry.url})
        deals = client.register_schema("app.deals-value", Schema(json.dumps(DEAL_AVRO), "AVRO"))
        users = client.register_schema("app.users-value", Schema(json.dumps(USER_AVRO), "AVRO"))
        produce(
            kafka,
            "app.deals",
            [
                (i % 2, str(i).encode(), avro_body(DEAL_AVRO, avro_deal(i), deals))
                for i in range(30)
            ],
        )
        people = [{"email": f"u{i}@x", "age": i if i % 3 else None} for i in range(12)]
        produce(kafka, "app.users", [(0, None, avro_body(USER_AVRO, u, users)) for u in people])
        spec = ImportSpec(
            kafka=kafka,
            topics=(),
            topic_pattern=r"app\..*",
            table="{topic}",
            sink_url=f"sqlite:///{tmp_path}/out.db",
            checkpoint=str(tmp_path / "ckpt"),
            value_format="avro",
            schema_registry=registry.url,
        )

        summary = run_import(spec, spark=spark)

    assert (summary.records, summary.imported) == (42, 42)
    with sqlite3.connect(tmp_path / "out.db") as conn:
        assert conn.execute("SELECT id, name FROM app_deals ORDER BY id").fetchall() == [
            (i, f"deal {i} v0") for i in range(30)
        ]
        assert conn.execute("SELECT email, age FROM app_users ORDER BY offset").fetchall() == [
            (u["email"], u["age"]) for u in people
        ]


@pytest.mark.parametrize(
    ("topics", "options", "says"),
    [
        (["ev.a-b", "ev.a_b"], ["--topic-pattern", r"ev\..*"], "would both land in table 'ev_a_b'"),
        (["ev.a"], ["--topic-pattern", "ev", "--topic", "ev.a"], "give it without --topic"),
        (["ev.a"], ["--topic-pattern", "nothing.*"], "matches --topic-pattern 'nothing.*'"),
        (["ev"], ["--topic-pattern", "ev", "--table", "t_{table}"], "topic 'ev' has no {table}"),
    ],
)
def test_a_routing_the_tables_cannot_take_is_one_line_exit_2_and_writes_nothing(
    broker, tmp_path, topics, options, says
):
    for topic in topics:
        broker.create_topic(topic, 1)
    result = lagless_cli(
        *("--bootstrap", broker.bootstrap, *options),
        *("--sink", f"sqlite:///{tmp_path}/out.db", "--checkpoint", str(tmp_path / "ckpt")),
    )

    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], result.stderr
    assert list(tmp_path.iterdir()) == []
