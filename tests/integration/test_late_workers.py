"""Spark gives each Python process it starts a fixed 10 s to connect back; on a busy machine the
source's planning runner misses it and the query fails before it reads anything. The import
starts its query again (the checkpoint replays nothing twice), and says so in its log.

The busy machine is staged, not waited for: PYSPARK_PYTHON is a wrapper that, the first time
Spark starts the streaming source's runner, sleeps 12 s before it becomes Python."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Producer

from lagless.broker import EmbeddedBroker
from lagless.exceptions import TerminalError, TransientError
from lagless.importer.job import late_worker, stopped_by

RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


def test_a_late_python_worker_is_recognised_through_the_errors_causes() -> None:
    spark_said = RuntimeError(
        "org.apache.spark.SparkException: Python worker failed to connect back."
    )
    wrapped = RuntimeError("the query stopped")
    wrapped.__cause__ = spark_said
    assert late_worker(wrapped)
    assert late_worker(
        RuntimeError("Timed out while waiting for the Python worker to connect back")
    )
    assert not late_worker(RuntimeError("An exception was thrown from the Python worker"))
    # Still late after the query's restarts: a rerun may pass (75), not a failure of the data.
    assert isinstance(stopped_by(wrapped), TransientError)
    assert isinstance(stopped_by(RuntimeError("boom")), TerminalError)


@pytest.mark.matrix
@pytest.mark.spark
def test_an_import_whose_planning_worker_starts_late_starts_its_query_again(
    tmp_path: Path,
) -> None:
    wrapper = tmp_path / "python.sh"
    wrapper.write_text(
        "#!/bin/bash\n"
        'for a in "$@"; do\n'
        f'  if [ "$a" = {RUNNER} ] && mkdir "{tmp_path}/slowed" 2>/dev/null; then sleep 12; fi\n'
        "done\n"
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    with EmbeddedBroker(topics={"orders": 2}) as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for number in range(200):
            producer.produce("orders", str(number).encode(), partition=number % 2)
        producer.flush(10)
        log = tmp_path / "lagless.log"
        done = subprocess.run(
            [sys.executable, "-m", "lagless", "--log-file", str(log), "import",
             "--bootstrap", broker.bootstrap, "--topic", "orders",
             "--sink", f"sqlite:///{tmp_path}/out.db", "--checkpoint", str(tmp_path / "ckpt")],
            capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYSPARK_PYTHON": str(wrapper)},
        )  # fmt: skip
    assert (tmp_path / "slowed").is_dir(), "the wrapper never saw the source's runner start"
    assert done.returncode == 0, done.stderr
    assert "starting the query again (1 of 3)" in log.read_text()
    rows = sqlite3.connect(tmp_path / "out.db").execute(
        "SELECT count(*), count(DISTINCT partition || '-' || offset) FROM orders"
    )
    assert rows.fetchone() == (200, 200)
