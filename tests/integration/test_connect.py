"""`lagless import --master sc://host:port` through a real Spark Connect server (pyspark's own,
started once per session by tests/harness/connect.py), from the CLI as users run it.

foreachBatch runs in a Python process of the server there (importer/connect_writer.py): the
tests prove it ran there (the batch lines in the log come from another process than the
import's), that the store holds every record once, that a rerun on the same checkpoint adds
nothing, and that failures inside the server (a broker away past the budget, met by the
server's tasks) and bad input keep their exit codes and their one line.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lagless.broker import EmbeddedBroker
from tests.integration.test_crash_safety import stored
from tests.integration.test_faults import (
    BATCH_LINE,
    PARTITIONS,
    TOPIC,
    BrokerProcess,
    Import,
    away_past_the_budget,
    finish,
    import_args,
    landed,
    produce,
    running_broker_process,
    stopped,
)

pytestmark = pytest.mark.spark


@pytest.fixture
def embedded_broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(topics={TOPIC: PARTITIONS}) as running:
        yield running


@pytest.fixture
def hangable_broker() -> Iterator[BrokerProcess]:
    """`lagless broker` in a process of its own: SIGSTOP hangs it."""
    with running_broker_process() as running:
        yield running


# test_faults' topic holds 2 partitions x 600 records; fewer batches than its 12 keep the
# default run short (each batch is a few round trips to the server).
BATCH_RECORDS = 400
BATCHES = 3


def summary(run: Import, name: str) -> dict[str, object]:
    out = Path(run.log.parent, f"{name}.out").read_text()
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def batch_pids(run: Import) -> set[int]:
    """The processes that logged a written batch (the log's lines carry the pid)."""
    pids = re.findall(r"^\S+ INFO (\d+) \S+: " + BATCH_LINE.pattern, run.log.read_text(), re.M)
    return {int(pid) for pid, *_ in pids}


@pytest.mark.parametrize("sink", ["parquet", pytest.param("sqlite", marks=pytest.mark.matrix)])
def test_an_import_through_spark_connect_lands_once_and_a_rerun_adds_nothing(
    embedded_broker, connect_server, tmp_path, sink
):
    url = f"{sink}:///{tmp_path}/{'out.db' if sink == 'sqlite' else 'lake'}"
    expected = produce(embedded_broker.bootstrap)
    args = [
        *import_args(embedded_broker.bootstrap, url, tmp_path / "ckpt", "bulk"),
        *("--max-records-per-batch", str(BATCH_RECORDS)),
        *("--master", connect_server.url, "--json"),
    ]
    first = Import(tmp_path / "run", args, "1")
    finish(first, "bulk", url, expected)
    figures = summary(first, "1")
    assert figures["records"] == len(expected) and figures["batches"] == BATCHES, figures
    # foreachBatch ran on the server: its batch lines come from a process other than this one.
    writers = batch_pids(first)
    assert writers and first.process.pid not in writers, writers
    # The folder the client and the server talked through is gone; the checkpoint remains.
    assert not list((tmp_path / "ckpt").glob("connect-*"))

    again = Import(tmp_path / "run", args, "2")
    finish(again, "bulk", url, expected)
    assert summary(again, "2")["records"] == 0
    assert landed(url) == expected


def test_a_typed_upsert_through_spark_connect_keeps_the_newest_row_per_key(
    embedded_broker, connect_server, tmp_path
):
    """Rows through Spark (the JVM's from_json, an Observation, the upsert) in the server's
    foreachBatch: one row per key, the newest; a rerun adds nothing. The DDL is parsed by the
    server."""
    url = f"sqlite:///{tmp_path}/out.db"
    expected = produce(embedded_broker.bootstrap)
    records = {}  # (key, partition, offset) -> seq
    for partition, offset, value in expected:
        assert value is not None
        record = json.loads(value)
        records[(record["key"], partition, offset)] = record["seq"]
    keys = {key for key, _, _ in records}
    args = [
        *import_args(embedded_broker.bootstrap, url, tmp_path / "ckpt", "bulk"),
        *("--value-format", "json", "--value-schema", "seq BIGINT NOT NULL, pad STRING"),
        *("--write", "upsert", "--max-records-per-batch", str(BATCH_RECORDS)),
        *("--master", connect_server.url, "--json"),
    ]
    for name in ("1", "2"):
        run = Import(tmp_path / "run", args, name)
        assert run.finish() == 0, run.stderr()
        assert "lagless:" not in run.stderr()
        # Upserted on the Kafka key, which the generator makes the value's "key" too.
        rows = [
            (bytes(key).decode(), *rest)
            for key, *rest in stored(url, TOPIC, ("key", "partition", "offset", "seq"))
        ]
        assert sorted(key for key, *_ in rows) == sorted(keys)  # one row per key
        for key, partition, offset, seq in rows:
            assert records[(key, partition, offset)] == seq  # a record of its key, typed
            # Newer wins: no later record of the key in the row's partition.
            assert not any(k == key and p == partition and o > offset for k, p, o in records), (
                key,
                partition,
                offset,
            )
    assert summary(run, "2")["records"] == 0


def test_a_broker_away_past_the_budget_inside_the_server_exits_75_and_a_rerun_completes(
    hangable_broker, connect_server, tmp_path
):
    """The server's tasks meet the hung broker; their TransientError crosses the server and
    the Connect client as its marker: exit 75, one line."""
    url = f"sqlite:///{tmp_path}/out.db"
    expected = produce(hangable_broker.bootstrap)
    args = [
        *import_args(hangable_broker.bootstrap, url, tmp_path / "ckpt", "bulk"),
        *("--master", connect_server.url),
    ]
    run = Import(tmp_path / "run", [*args, "--retry-seconds", "4"], "1")
    run.wait_for_batches(1)
    hangable_broker.hang()
    try:
        away_past_the_budget(run, hangable_broker, url, expected)
    finally:
        hangable_broker.resume()
    finish(Import(tmp_path / "run", args, "2"), "bulk", url, expected)


def one_line_exit(args: list[str], tmp_path: Path) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "lagless", "--log-file", str(tmp_path / "log"), "import", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return done.returncode, lines[0]


def test_bad_input_over_spark_connect_is_one_line_and_exit_2(
    embedded_broker, connect_server, tmp_path
):
    bootstrap = embedded_broker.bootstrap
    produce(bootstrap)
    base = import_args(bootstrap, f"sqlite:///{tmp_path}/out.db", tmp_path / "ck", "bulk")
    json_values = [*base, "--value-format", "json", "--master", connect_server.url]

    code, line = one_line_exit([*json_values, "--value-schema", "id BIGINT NOT"], tmp_path)
    assert code == 2 and "--value-schema is not a Spark DDL schema" in line, line

    code, line = one_line_exit([*json_values, "--value-schema", "infer"], tmp_path)
    assert code == 2 and "cannot run over Spark Connect" in line, line

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        nobody = f"sc://127.0.0.1:{unused.getsockname()[1]}"
        code, line = one_line_exit([*base, "--master", nobody], tmp_path)
    assert code == 2 and f"the Spark Connect server at {nobody} does not answer" in line, line
    assert not (tmp_path / "out.db").exists()
    assert not (tmp_path / "ck").exists()  # no checkpoint that would refuse other arguments


@pytest.mark.matrix
@pytest.mark.parametrize("mode", ["bulk", "continuous"])
def test_a_signal_stops_an_import_through_spark_connect_and_a_rerun_completes(
    embedded_broker, connect_server, tmp_path, mode
):
    """SIGINT reaches the client only (the server runs on): the stop file asks the server's
    writer to refuse the batch after the one in flight; the query is stopped from the client."""
    url = f"sqlite:///{tmp_path}/out.db"
    expected = produce(embedded_broker.bootstrap)
    args = [
        *import_args(embedded_broker.bootstrap, url, tmp_path / "ckpt", mode),
        *("--master", connect_server.url),
    ]
    run = Import(tmp_path / "run", args, "1")
    run.wait_for_batches(2)
    run.signal(signal.SIGINT)
    stopped(run, signal.SIGINT, url, expected, mode)
    assert connect_server.process.poll() is None
    finish(Import(tmp_path / "run", args, "2"), mode, url, expected)


def test_a_typed_append_the_tasks_write_through_spark_connect_keeps_every_record_once(
    embedded_broker, connect_server, tmp_path
):
    """Typed JSON into Parquet through the server: its tasks write the rows of the values they
    decode, the server's foreachBatch shapes the poison they leave (a Spark job of the server
    over the left files) into dead letters, one commit per batch; a rerun adds nothing."""
    from lagless.gen import explicit, produce_profile
    from lagless.kafka.config import KafkaConfig
    from lagless.sinks.base import DEAD_LETTER_COLUMNS

    kafka = KafkaConfig(embedded_broker.bootstrap)
    produce_profile(kafka, TOPIC, explicit([300] * PARTITIONS), keys=12, poison=0.02)
    url = f"parquet:///{tmp_path}/lake"
    args = [
        *import_args(embedded_broker.bootstrap, url, tmp_path / "ckpt", "bulk"),
        *("--value-format", "json", "--value-schema", "seq BIGINT NOT NULL, pad STRING"),
        *("--max-records-per-batch", str(BATCH_RECORDS)),
        *("--master", connect_server.url, "--json"),
    ]
    run = Import(tmp_path / "run", args, "1")
    assert run.finish() == 0, run.stderr()
    assert "records left to Spark's rows" in run.log.read_text()  # the path under test
    rerun = Import(tmp_path / "run", args, "2")
    assert rerun.finish() == 0, rerun.stderr()
    first, again = summary(run, "1"), summary(rerun, "2")
    assert (first["records"], first["dead_lettered"], again["records"]) == (600, 8, 0), first
    rows = stored(url, TOPIC, ("partition", "offset", "seq"))
    dead = stored(url, f"{TOPIC}_dlq", DEAD_LETTER_COLUMNS)
    assert len(rows) == 592 and len(set(rows)) == 592 and all(isinstance(s, int) for *_, s in rows)
    assert len(dead) == 8 and {row[0] for row in dead} == {TOPIC}


@pytest.mark.matrix
def test_a_routed_import_through_spark_connect_fills_a_table_per_topic(
    embedded_broker, connect_server, tmp_path
):
    """--topic-pattern through the server: its BatchWriter gets every table (the recipe's
    destinations), its tasks each write one topic's files into that topic's table."""
    from lagless.gen import explicit, produce_profile
    from lagless.kafka.config import KafkaConfig

    kafka = KafkaConfig(embedded_broker.bootstrap)
    embedded_broker.create_topic(f"{TOPIC}_b", 1)
    produce_profile(kafka, TOPIC, explicit([200] * PARTITIONS), keys=12)
    produce_profile(kafka, f"{TOPIC}_b", explicit([150]), keys=12)
    url = f"parquet:///{tmp_path}/lake"
    args = [
        *("--bootstrap", embedded_broker.bootstrap, "--topic-pattern", f"{TOPIC}(_b)?"),
        *("--sink", url, "--checkpoint", str(tmp_path / "ckpt")),
        *("--max-records-per-batch", str(BATCH_RECORDS)),
        *("--master", connect_server.url, "--json"),
    ]
    run = Import(tmp_path / "run", args, "1")
    assert run.finish() == 0, run.stderr()
    assert summary(run, "1")["records"] == 550
    for table, partitions, records in ((TOPIC, PARTITIONS, 200), (f"{TOPIC}_b", 1, 150)):
        rows = stored(url, table, ("partition", "offset"))
        assert rows == [(p, o) for p in range(partitions) for o in range(records)], table
