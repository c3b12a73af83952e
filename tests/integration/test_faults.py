"""Faults at the edges, from the CLI (issue 16): a broker hung (its `lagless broker` process
paused with SIGSTOP: nothing is lost, it answers again on SIGCONT) or down (the embedded
broker's down/up controls), a PostgreSQL server restarted, and SIGINT/SIGTERM, during bulk and
continuous imports into every store.

Inside the retry budget the import rides the fault out: exit 0 and every record once. Past it:
exit 75 with one line on stderr, and a rerun ends like a clean run. A signal: a bulk import
exits 130/143 with one line, a continuous one 0 (its usual end), and a rerun ends like a clean
run. Expectations come from the topic itself, read back
with a plain consumer (test_crash_safety.read_topic).

The default run keeps a few representative cases; the full matrix is marked `matrix`.
"""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import pytest

from lagless.broker import EmbeddedBroker
from lagless.gen import explicit, produce_profile
from lagless.kafka.config import KafkaConfig
from tests.integration.test_crash_safety import read_topic, stored

pytestmark = pytest.mark.spark

TOPIC = "faults"
PARTITIONS = 2
RECORDS_PER_PARTITION = 600
BATCH_RECORDS = 100  # 12 batches: a fault lands mid-import
PROCESS_TIMEOUT_S = 240.0
SHORT_BUDGET_S = 4.0
SINKS = ("sqlite", "parquet", "delta", "postgresql")
MODES = ("bulk", "continuous")
Row = tuple[int, int, bytes | None]  # partition, offset, value
BATCH_LINE = re.compile(r"batch (\d+): (\d+) records")
# What an import logs when it meets a broker that is away: the planning's retry (retry.py) or
# a task's wait for a record (source/reader.py).
MET_THE_OUTAGE = re.compile(r" is away \(| the broker may be away")


@dataclass
class BrokerProcess:
    """`lagless broker` in a process of its own, so that SIGSTOP hangs it."""

    process: subprocess.Popen[str]
    bootstrap: str

    def hang(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)


@pytest.fixture
def broker_process() -> Iterator[BrokerProcess]:
    with running_broker_process() as running:
        yield running


@contextmanager
def running_broker_process() -> Iterator[BrokerProcess]:
    process = subprocess.Popen(
        [sys.executable, "-m", "lagless", "broker", "--topic", f"{TOPIC}:{PARTITIONS}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    running = BrokerProcess(process, process.stdout.readline().strip())
    try:
        yield running
    finally:
        with suppress(ProcessLookupError):
            running.resume()
            process.terminate()
        process.wait(timeout=30)


@pytest.fixture
def embedded() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(topics={TOPIC: PARTITIONS}) as running:
        yield running


class Import:
    """`python -m lagless --log-file LOG import ...` as a subprocess in its own session."""

    def __init__(self, folder: Path, args: list[str], name: str, terminal: bool = False) -> None:
        """terminal: stdout is a terminal's (a pseudo-terminal: `terminal_output()`)."""
        folder.mkdir(parents=True, exist_ok=True)
        self.log = folder / f"{name}.log"
        self.err = folder / f"{name}.err"
        self.out = folder / f"{name}.out"
        self._terminal: int | None = None
        with open(self.out, "w") as out, open(self.err, "w") as err:
            stdout: int | TextIO = out
            if terminal:
                self._terminal, stdout = pty.openpty()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "lagless", "--log-file", str(self.log), "import", *args],
                stdout=stdout,
                stderr=err,
                start_new_session=True,
            )
            if isinstance(stdout, int):
                os.close(stdout)

    def terminal_output(self) -> str:
        """What the import wrote to its terminal, once it ended."""
        assert self._terminal is not None
        chunks = []
        with suppress(OSError):  # EIO: the other end is closed and drained
            while chunk := os.read(self._terminal, 65536):
                chunks.append(chunk)
        os.close(self._terminal)
        return b"".join(chunks).decode(errors="replace")

    def batches(self) -> list[tuple[int, int]]:
        """(batch id, records) of each batch the import logged as written."""
        text = self.log.read_text() if self.log.exists() else ""
        return [(int(m[1]), int(m[2])) for m in BATCH_LINE.finditer(text)]

    def wait_for_batches(self, count: int, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.batches()) < count:
            assert self.process.poll() is None, f"the import ended early: {self.stderr()}"
            assert time.monotonic() < deadline, "the import wrote no batch in time"
            time.sleep(0.1)

    def wait_for_the_outage(self, timeout_s: float = 120.0) -> None:
        """Until the import logs that it met the broker away (MET_THE_OUTAGE): a test that
        rides an outage out shows that there was one to ride out."""
        deadline = time.monotonic() + timeout_s
        while not MET_THE_OUTAGE.search(self.log.read_text() if self.log.exists() else ""):
            assert self.process.poll() is None, f"the import ended early: {self.stderr()}"
            assert time.monotonic() < deadline, "the import logged no outage in time"
            time.sleep(0.2)

    def signal(self, number: int) -> None:
        """As a terminal's Ctrl-C (SIGINT) reaches every process of the foreground group."""
        if number == signal.SIGINT:
            os.killpg(self.process.pid, number)
        else:
            os.kill(self.process.pid, number)

    def finish(self, timeout_s: float = PROCESS_TIMEOUT_S) -> int:
        try:
            return self.process.wait(timeout=timeout_s)
        finally:
            # The JVM and Python workers of a stopped import would otherwise outlive it.
            with suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stderr(self) -> str:
        return self.err.read_text()

    def stderr_lines(self) -> list[str]:
        return [line for line in self.stderr().splitlines() if line.strip()]


def sink_url(sink: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """The store's URL; PostgreSQL: a database of the test's own on the shared server."""
    if sink == "postgresql":
        import psycopg

        server = request.getfixturevalue("postgres")
        database = "faults_" + re.sub(r"\W", "_", tmp_path.name).lower()[-40:]
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{database}"')
        return str(server.url).rsplit("/", 1)[0] + f"/{database}"
    return f"{sink}:///{tmp_path}/{'out.db' if sink == 'sqlite' else 'lake'}"


def import_args(bootstrap: str, sink: str, checkpoint: Path, mode: str, *extra: str) -> list[str]:
    return [
        "--bootstrap",
        bootstrap,
        "--topic",
        TOPIC,
        "--sink",
        sink,
        "--checkpoint",
        str(checkpoint),
        "--mode",
        mode,
        "--max-records-per-batch",
        str(BATCH_RECORDS),
        *extra,
    ]


def produce(bootstrap: str) -> list[Row]:
    """The topic's records as (partition, offset, value), read back with a plain consumer."""
    kafka = KafkaConfig(bootstrap)
    produce_profile(kafka, TOPIC, explicit([RECORDS_PER_PARTITION] * PARTITIONS), keys=20)
    return sorted((r.partition, r.offset, r.value) for r in read_topic(kafka, TOPIC, PARTITIONS))


def landed(sink: str, table: str = TOPIC) -> list[Row]:
    """What the store holds, duplicates kept."""
    return [
        (int(p), int(o), None if v is None else bytes(v))
        for p, o, v in stored(sink, table, ("partition", "offset", "value"))
    ]


def finish(run: Import, mode: str, sink: str, expected: list[Row]) -> None:
    """A bulk import ends by itself; a continuous one, once the store holds every record, is
    stopped the usual way (SIGTERM). Either exits 0."""
    if mode == "continuous":
        deadline = time.monotonic() + PROCESS_TIMEOUT_S
        while len(landed(sink)) < len(expected):
            assert run.process.poll() is None, f"the import ended early: {run.stderr()}"
            assert time.monotonic() < deadline, "the import did not catch up in time"
            time.sleep(0.5)
        # stdout a file (a supervisor's log): what comes and where the log is said at the
        # start, and the first batch's line at once, not only at the end.
        said = run.out.read_text()
        assert f"every batch in the log, {run.log} (pid {run.process.pid})" in said, said
        assert "  batch of " in said and "(the first: Spark's start in it)" in said, said
        run.signal(signal.SIGTERM)
    code = run.finish()
    assert code == 0, run.stderr()
    assert "Traceback" not in run.stderr() and "lagless:" not in run.stderr()
    assert landed(sink) == expected


# --- a broker hung or down for less than the budget: ridden out ----------------------------


def ride_out_hung_broker(
    broker_process: BrokerProcess, sink: str, mode: str, tmp_path: Path
) -> None:
    expected = produce(broker_process.bootstrap)
    run = Import(
        tmp_path / "run", import_args(broker_process.bootstrap, sink, tmp_path / "ckpt", mode), "1"
    )
    run.wait_for_batches(1)
    broker_process.hang()
    try:
        run.wait_for_the_outage()
    finally:
        broker_process.resume()
    finish(run, mode, sink, expected)


@pytest.mark.matrix
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sink", SINKS)
def test_a_hung_broker_is_ridden_out(broker_process, tmp_path, request, sink, mode):
    ride_out_hung_broker(broker_process, sink_url(sink, tmp_path, request), mode, tmp_path)


def ride_out_broker_down(embedded: EmbeddedBroker, sink: str, mode: str, tmp_path: Path) -> None:
    expected = produce(embedded.bootstrap)
    run = Import(
        tmp_path / "run", import_args(embedded.bootstrap, sink, tmp_path / "ckpt", mode), "1"
    )
    run.wait_for_batches(1)
    embedded.set_down()
    try:
        run.wait_for_the_outage()
    finally:
        embedded.set_up()
    finish(run, mode, sink, expected)


@pytest.mark.matrix
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sink", SINKS)
def test_a_broker_down_is_ridden_out(embedded, tmp_path, request, sink, mode):
    ride_out_broker_down(embedded, sink_url(sink, tmp_path, request), mode, tmp_path)


# --- past the budget: exit 75, one line, a rerun ends like a clean run ----------------------


def away_past_the_budget(
    run: Import, broker_process: BrokerProcess, sink: str, expected: list[Row]
) -> None:
    code = run.finish()
    assert code == 75, run.stderr()
    lines = run.stderr_lines()
    assert len(lines) == 1, run.stderr()
    assert lines[0].startswith("lagless: failed, may pass on a rerun: "), lines
    assert f"the broker at {broker_process.bootstrap}" in lines[0]
    assert "was away for" in lines[0] and f"details: {run.log}" in lines[0]
    assert re.search(r"is away|giving up|no record from", run.log.read_text()), "nothing logged"
    held = landed(sink)
    assert len(held) == len(set(held)) and set(held) < set(expected)


def past_the_budget(broker_process: BrokerProcess, sink: str, mode: str, tmp_path: Path) -> None:
    """Hung past the budget: exit 75, one line; a rerun ends like a clean run."""
    expected = produce(broker_process.bootstrap)
    args = import_args(broker_process.bootstrap, sink, tmp_path / "ckpt", mode)
    run = Import(tmp_path / "run", [*args, "--retry-seconds", str(SHORT_BUDGET_S)], "1")
    run.wait_for_batches(1)
    broker_process.hang()
    try:
        away_past_the_budget(run, broker_process, sink, expected)
    finally:
        broker_process.resume()
    finish(Import(tmp_path / "run", args, "2"), mode, sink, expected)


def test_an_import_hung_past_the_budget_then_stopped_by_ctrl_c_resumes_exactly(
    broker_process, tmp_path
):
    """The default run's representative (each CLI run starts Spark: kept to three runs). SQLite,
    bulk: hung past the budget (75, one line), rerun and Ctrl-C (130, one line), rerun that
    rides a shorter hang out (0): the store ends like a clean run. The matrix is below."""
    sink = f"sqlite:///{tmp_path}/out.db"
    expected = produce(broker_process.bootstrap)
    args = import_args(broker_process.bootstrap, sink, tmp_path / "ckpt", "bulk")
    run = Import(tmp_path / "run", [*args, "--retry-seconds", str(SHORT_BUDGET_S)], "1")
    run.wait_for_batches(1)
    broker_process.hang()
    try:
        away_past_the_budget(run, broker_process, sink, expected)
    finally:
        broker_process.resume()

    run = Import(tmp_path / "run", args, "2")
    run.wait_for_batches(1)
    run.signal(signal.SIGINT)
    stopped(run, signal.SIGINT, sink, expected)

    run = Import(tmp_path / "run", args, "3")
    run.wait_for_batches(1)
    broker_process.hang()
    try:
        run.wait_for_the_outage()
    finally:
        broker_process.resume()
    finish(run, "bulk", sink, expected)


@pytest.mark.matrix
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sink", SINKS)
def test_past_the_budget(broker_process, tmp_path, request, sink, mode):
    past_the_budget(broker_process, sink_url(sink, tmp_path, request), mode, tmp_path)


# --- PostgreSQL restarted -------------------------------------------------------------------


@pytest.mark.matrix
@pytest.mark.parametrize("mode", MODES)
def test_a_postgresql_restart_is_ridden_out(embedded, tmp_path, request, mode):
    server = request.getfixturevalue("postgres")
    sink = sink_url("postgresql", tmp_path, request)
    expected = produce(embedded.bootstrap)
    run = Import(
        tmp_path / "run", import_args(embedded.bootstrap, sink, tmp_path / "ckpt", mode), "1"
    )
    run.wait_for_batches(1)
    server.stop()
    time.sleep(5.0)
    server.start()
    finish(run, mode, sink, expected)


# --- SIGINT / SIGTERM -----------------------------------------------------------------------


def stopped(run: Import, number: int, sink: str, expected: list[Row], mode: str = "bulk") -> None:
    """Bulk: 128 + the signal and one line. Continuous: the signal is its usual end, exit 0
    (the summary on stderr, no error line). Either way nothing is half-written."""
    code = run.finish()
    if mode == "bulk":
        assert code == 128 + number, run.stderr()
        lines = run.stderr_lines()
        assert len(lines) == 1, run.stderr()
        assert lines[0].startswith(f"lagless: stopped by {signal.Signals(number).name}"), lines
        assert "a rerun resumes" in lines[0]
    else:
        assert code == 0, run.stderr()
        assert "lagless:" not in run.stderr() and "Traceback" not in run.stderr()
    assert "reentrant" not in run.log.read_text()
    held = landed(sink)
    assert len(held) == len(set(held)) and set(held) <= set(expected)


def stopped_by_signal(
    bootstrap: str, sink: str, mode: str, number: int, tmp_path: Path, twice: bool = False
) -> None:
    expected = produce(bootstrap)
    args = import_args(bootstrap, sink, tmp_path / "ckpt", mode)
    run = Import(tmp_path / "run", args, "1")
    run.wait_for_batches(2)
    run.signal(number)
    if twice:
        time.sleep(0.05)
        run.signal(number)
    stopped(run, number, sink, expected, mode)
    finish(Import(tmp_path / "run", args, "2"), mode, sink, expected)


@pytest.mark.matrix
def test_a_second_ctrl_c_stops_a_bulk_import_at_once_and_a_rerun_completes(embedded, tmp_path):
    sink = f"sqlite:///{tmp_path}/out.db"
    stopped_by_signal(embedded.bootstrap, sink, "bulk", signal.SIGINT, tmp_path, twice=True)


@pytest.mark.matrix
@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sink", SINKS)
def test_a_signal_stops_an_import(embedded, tmp_path, request, sink, mode, number):
    url = sink_url(sink, tmp_path, request)
    stopped_by_signal(embedded.bootstrap, url, mode, number, tmp_path)


# --- a stop request during an outage: the wait for the broker ends (issue 31.3) ------------

# The retry budget is the default (300 s): an import that waited it out would fail the test.
STOP_DURING_OUTAGE_S = 60.0


def test_sigterm_stops_a_continuous_import_waiting_for_a_hung_broker(broker_process, tmp_path):
    """Caught up, the broker hung (SIGSTOP): the planning waits for it with retries. SIGTERM
    ends that wait: exit 0 within seconds (Kubernetes kills at 30), not after the budget, and
    the table holds every record once."""
    sink = f"sqlite:///{tmp_path}/out.db"
    expected = produce(broker_process.bootstrap)
    run = Import(
        tmp_path / "run",
        import_args(broker_process.bootstrap, sink, tmp_path / "ckpt", "continuous"),
        "1",
        terminal=True,
    )
    run.wait_for_batches(1)
    deadline = time.monotonic() + PROCESS_TIMEOUT_S
    while len(landed(sink)) < len(expected):
        assert run.process.poll() is None and time.monotonic() < deadline, run.stderr()
        time.sleep(0.5)
    broker_process.hang()
    try:
        run.wait_for_the_outage()  # the planning is inside its retries
        run.signal(signal.SIGTERM)
        code = run.finish(timeout_s=STOP_DURING_OUTAGE_S)
    finally:
        broker_process.resume()
    assert code == 0, run.stderr()
    assert "lagless:" not in run.stderr() and "Traceback" not in run.stderr()
    assert "a stop was asked for; no longer waiting" in run.log.read_text()
    assert landed(sink) == expected
    # On a terminal, a line per batch (issue 34.2), then the summary.
    shown = run.terminal_output().splitlines()
    batches = [line for line in shown if re.search(r"  batch of [\d,]+ records  .+  behind ", line)]
    assert len(batches) == len(run.batches()), shown
    assert "(the first: Spark's start in it)" in batches[0]
    assert all("records/s" in line for line in batches[1:]), shown
    assert shown[-1].strip() == "up to date", shown


@pytest.mark.matrix
@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_a_bulk_import_waiting_for_a_hung_broker(broker_process, tmp_path, number):
    """Mid-import, the broker hung: the next batch's planning (or its tasks' reading) waits.
    A signal ends the wait: 128 + the signal within seconds, whole batches only; a rerun with
    the broker back ends like a clean run."""
    sink = f"sqlite:///{tmp_path}/out.db"
    expected = produce(broker_process.bootstrap)
    args = import_args(broker_process.bootstrap, sink, tmp_path / "ckpt", "bulk")
    run = Import(tmp_path / "run", args, "1")
    run.wait_for_batches(2)
    broker_process.hang()
    try:
        run.wait_for_the_outage()
        run.signal(number)
        code = run.finish(timeout_s=STOP_DURING_OUTAGE_S)
    finally:
        broker_process.resume()
    assert code == 128 + number, run.stderr()
    assert run.stderr_lines()[0].startswith(f"lagless: stopped by {signal.Signals(number).name}")
    held = landed(sink)
    assert len(held) == len(set(held)) and set(held) < set(expected)
    assert len(held) % BATCH_RECORDS == 0  # whole batches: none half-written
    finish(Import(tmp_path / "run", args, "2"), "bulk", sink, expected)


# --- offsets deleted before they were read, skipped under failOnDataLoss=false --------------


def test_records_deleted_before_they_were_read_are_skipped_and_counted(
    broker, kafka, topic_name, tmp_path, spark
):
    """Retention ran past a stopped import's checkpoint: --skip-lost-offsets skips what is gone
    and the summary counts it (in process: Spark's session is shared, the broker's deletion is
    librdkafka's mock, as retention would delete)."""
    from lagless.importer.job import run_import
    from lagless.importer.spec import ImportSpec

    broker.create_topic(topic_name, 1)
    produce_profile(kafka, topic_name, explicit([300]))
    spec = ImportSpec(
        kafka=kafka,
        topics=(topic_name,),
        sink_url=f"sqlite:///{tmp_path}/out.db",
        checkpoint=str(tmp_path / "ckpt"),
        fail_on_data_loss=False,
    )
    assert run_import(spec, spark=spark).records == 300
    produce_profile(kafka, topic_name, explicit([300]), seed=1)
    broker.delete_records(topic_name, 0, 420)  # 300..419 never read

    summary = run_import(spec, spark=spark)

    assert (summary.records, summary.skipped) == (180, 120)
    assert summary.as_dict()["skipped"] == 120
    offsets = [o for _, o, _ in landed(spec.sink_url, topic_name)]
    assert offsets == [*range(300), *range(420, 600)]
