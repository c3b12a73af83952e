"""One Delta or Iceberg table shared (issue 61): two continuous imports, each of its own topic,
maintain the table every 2 s with a 5 s window while `lagless maintain` runs again and again
beside them. Both imports stay up until they are stopped, every `maintain` run exits 0 or 75
(a table other writers kept changing, skipped in one line), and the table holds every record
of both topics exactly once.

Real `lagless` processes on the embedded broker, the tables in a local folder and on a real S3
server (SeaweedFS); the CI cases produce for 15 s (~60-90 s each with Spark's start), the
matrix's for three minutes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from lagless.broker import EmbeddedBroker
from tests.integration.test_crash_safety import stored

pytestmark = pytest.mark.spark

TOPICS = ("shared_a", "shared_b")
PARTITIONS = 2
RATE = 100  # records a second, per topic
WAIT_S = 240.0
COLUMNS = ("topic", "partition", "offset")


def started(args: list[str], folder: Path, name: str) -> subprocess.Popen[bytes]:
    out = open(folder / f"{name}.out", "wb")  # noqa: SIM115 (the process holds it)
    err = open(folder / f"{name}.err", "wb")  # noqa: SIM115
    return subprocess.Popen(
        [sys.executable, "-m", "lagless", *args], stdout=out, stderr=err, start_new_session=True
    )


def produce(bootstrap: str, seconds: float) -> dict[tuple[str, int], int]:
    """RATE records a second into each topic, spread over its partitions, for `seconds`:
    how many each partition got."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    sent: dict[tuple[str, int], int] = {}
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        for topic in TOPICS:
            for _ in range(RATE // 10):
                partition = n % PARTITIONS
                producer.produce(topic, key=f"k{n}".encode(), value=b"v", partition=partition)
                sent[(topic, partition)] = sent.get((topic, partition), 0) + 1
                n += 1
        producer.poll(0)
        time.sleep(0.1)
    producer.flush(30)
    return sent


def held(url: str) -> list[tuple[Any, ...]] | None:
    """The table's (topic, partition, offset) rows, read as a reader would while the imports
    and maintenance run; None when the read met a version removed under it (read again)."""
    try:
        return stored(url, "shared", COLUMNS)
    except Exception:  # a reader's own race with expiry (docs/maintenance.md): read again
        return None


@pytest.mark.parametrize(
    ("store", "seconds"),
    [
        ("delta", 15),
        ("iceberg", 15),
        ("delta+s3", 15),
        ("iceberg+s3", 15),
        pytest.param("delta", 180, marks=pytest.mark.matrix),
        pytest.param("iceberg", 180, marks=pytest.mark.matrix),
    ],
)
def test_two_continuous_imports_and_maintain_share_a_table(
    store: str, seconds: float, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = f"{store}:///{tmp_path}/lake"
    if store.endswith("+s3"):
        s3 = request.getfixturevalue("s3_env")  # its AWS variables reach the processes started
        plain = store.removesuffix("+s3")
        catalog = f"?catalog={tmp_path}/catalog.db" if plain == "iceberg" else ""
        url = s3.url(plain, f"{tmp_path.name}/lake") + catalog
    with EmbeddedBroker(topics=dict.fromkeys(TOPICS, PARTITIONS)) as broker:
        imports = {
            topic: started(
                [
                    "import",
                    *("--bootstrap", broker.bootstrap, "--topic", topic),
                    *("--sink", url, "--table", "shared"),
                    *("--checkpoint", str(tmp_path / f"ckpt_{topic}")),
                    *("--mode", "continuous", "--trigger-seconds", "0.5"),
                    *("--maintain-every", "2", "--keep-history", "5"),
                ],
                tmp_path,
                topic,
            )
            for topic in TOPICS
        }
        maintained: list[subprocess.CompletedProcess[str]] = []
        producing = threading.Event()
        producing.set()

        def maintain_again_and_again() -> None:
            while producing.is_set():
                maintained.append(
                    subprocess.run(
                        [sys.executable, "-m", "lagless", "maintain", "--sink", url],
                        capture_output=True,
                        text=True,
                        timeout=120,
                    )
                )

        sent = produce(broker.bootstrap, 1)  # the first records: both imports write them
        deadline = time.monotonic() + WAIT_S
        while not {row[0] for row in held(url) or []} >= set(TOPICS):
            assert time.monotonic() < deadline, "the imports did not start"
            assert all(process.poll() is None for process in imports.values())
            time.sleep(0.5)
        beside = threading.Thread(target=maintain_again_and_again, daemon=True)
        beside.start()
        try:
            for topic, count in produce(broker.bootstrap, seconds).items():
                sent[topic] += count
        finally:
            producing.clear()
            beside.join(timeout=150)
        expected = sorted(
            (topic, partition, offset)
            for (topic, partition), count in sent.items()
            for offset in range(count)
        )
        deadline = time.monotonic() + WAIT_S
        rows = held(url)
        while rows != expected and time.monotonic() < deadline:
            if any(process.poll() is not None for process in imports.values()):
                break
            time.sleep(1)
            rows = held(url)
        up = {topic: process.poll() is None for topic, process in imports.items()}
        for process in imports.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        codes = {topic: process.wait(timeout=120) for topic, process in imports.items()}

    errors = {t: (tmp_path / f"{t}.err").read_text(errors="replace")[-2000:] for t in TOPICS}
    assert all(up.values()), (codes, errors)
    assert set(codes.values()) <= {0, 130, 143}, (codes, errors)
    assert maintained and all(run.returncode in (0, 75) for run in maintained), [
        (run.returncode, run.stderr) for run in maintained if run.returncode not in (0, 75)
    ]
    for run in maintained:
        if run.returncode == 75:
            assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert rows == expected, (len(rows or []), len(expected), errors)
