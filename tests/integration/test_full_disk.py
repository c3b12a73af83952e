"""A store on a full disk (issue 31, point 6): the Spark Python worker writing the batch's
files fails with OSError ENOSPC, and the one line says so (the worker's innermost error,
exceptions.worker_error), not "An exception was thrown from the Python worker". The disk is
really full: a 1 MiB tmpfs mounted for the test (root, as CI runs; nothing faked), the
checkpoint on the ordinary disk. Nothing is committed: the table holds no row."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.integration.test_crash_safety import stored

pytestmark = pytest.mark.spark


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    assert os.geteuid() == 0, "the test mounts a tmpfs: it runs as root (CI does)"
    folder = tmp_path / "tiny"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


@pytest.mark.parametrize(
    "store",
    [
        "parquet",
        pytest.param("sqlite", marks=pytest.mark.matrix),
        pytest.param("delta", marks=pytest.mark.matrix),
        pytest.param("iceberg", marks=pytest.mark.matrix),
    ],
)
def test_a_full_disk_is_named_in_the_one_line(
    store, broker, kafka, topic_name, tmp_path, tiny_disk
):
    broker.create_topic(topic_name, 2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for n in range(6000):  # 2.4 MB of values that do not compress
        producer.produce(topic_name, value=os.urandom(400), partition=n % 2)
    producer.flush(30)
    url = f"{store}:///{tiny_disk}/{'d.db' if store == 'sqlite' else 'lake'}"

    done = subprocess.run(
        [sys.executable, "-m", "lagless", "import", "--bootstrap", kafka.bootstrap,
         "--topic", topic_name, "--sink", url, "--checkpoint", str(tmp_path / "ckpt")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip

    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("lagless: failed: import stopped: OSError: [Errno 28] ")
    assert "No space left on device" in done.stderr
    assert "Python worker" not in done.stderr
    assert stored(url, topic_name, ("offset",)) == []


@pytest.mark.parametrize("store", ["delta", "iceberg"])
def test_maintain_on_a_full_disk_names_it_in_one_line(tiny_disk: Path, store: str) -> None:
    """Issue 61: `lagless maintain` whose compaction meets a full disk says so (exit 1), not
    "failed unexpectedly"; the table keeps its rows."""
    from lagless.sinks import sink_from_url
    from lagless.sinks.ledger import Batch
    from tests.unit.test_ledger_stores import TARGET, TOPIC, commit

    url = f"{store}:///{tiny_disk}/lake"
    with sink_from_url(url) as sink:
        sink.prepare(TARGET)
        for n in range(6):
            commit(sink, TARGET, Batch(n, {(TOPIC, 0): (n * 5, n * 5 + 5)}))
    filler = tiny_disk / "filler"
    written = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:  # the disk full
        while True:
            os.write(written, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(written)

    done = subprocess.run(
        [sys.executable, "-m", "lagless", "maintain", "--sink", url, "--table", "t"],
        capture_output=True,
        text=True,
        timeout=120,
    )

    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert "no space left on the disk" in lines[0] and "unexpectedly" not in lines[0], lines
    filler.unlink()
    assert sorted(stored(url, "t", ("offset",))) == [(o,) for o in range(30)]
