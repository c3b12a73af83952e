"""`lagless gen` and `lagless broker` against a real embedded broker over TCP."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from lagless.broker import EmbeddedBroker
from lagless.cli.main import main
from lagless.gen import RecordKind, explicit, produce_profile
from lagless.gen.profiles import PARTITION_BYTES_LIMIT, seed_000, seed_002
from lagless.kafka.config import KafkaConfig


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(topics={"small": 4, "wide": 24, "twin": 4}) as running:
        yield running


def watermarks(config: KafkaConfig, topic: str, partitions: int) -> list[tuple[int, int]]:
    consumer = Consumer(config.reader())
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            for p in range(partitions)
        ]
    finally:
        consumer.close()


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes


def read_all(config: KafkaConfig, topic: str, ends: dict[int, int]) -> list[Record]:
    """Every record of the non-empty partitions in `ends`, from offset 0 to its end."""
    wanted = {p for p, end in ends.items() if end}
    consumer = Consumer(config.reader())
    consumer.assign([TopicPartition(topic, p, 0) for p in wanted])
    records: list[Record] = []
    try:
        while wanted:
            msg = consumer.poll(5)
            assert msg is not None, f"no record within 5 s; partitions left {wanted}"
            error = msg.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                wanted.discard(msg.partition())
                continue
            records.append(
                Record(msg.partition() or 0, msg.offset() or 0, msg.key(), msg.value() or b"")
            )
    finally:
        consumer.close()
    return records


def kind_of(record: Record) -> RecordKind:
    if record.key is None:
        return RecordKind.NULL_KEY
    try:
        text = record.value.decode()
    except UnicodeDecodeError:
        return RecordKind.INVALID_UTF8
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return RecordKind.INVALID_JSON
    return RecordKind.GOOD


def test_gen_writes_exactly_the_counts_of_the_profile(broker: EmbeddedBroker) -> None:
    config = KafkaConfig(broker.bootstrap)
    counts = [300, 0, 1_000, 7]
    summary = produce_profile(config, "small", explicit(counts), keys=10, seed=1)
    assert watermarks(config, "small", 4) == [(0, c) for c in counts]
    assert summary.offsets == {p: (0, c) for p, c in enumerate(counts)}
    assert summary.kinds[RecordKind.GOOD] == sum(counts)
    assert summary.partitions_written == 3
    # a second run appends after the first
    again = produce_profile(config, "small", explicit([5, 5]), keys=10, seed=1)
    assert again.offsets == {0: (300, 305), 1: (0, 5)}
    assert watermarks(config, "small", 2) == [(0, 305), (0, 5)]


def test_poison_share_and_kinds_are_as_asked(broker: EmbeddedBroker) -> None:
    config = KafkaConfig(broker.bootstrap)
    counts = [400, 200, 0, 300]
    summary = produce_profile(config, "small", explicit(counts), keys=5, poison=0.3, seed=2)
    records = read_all(config, "small", dict(enumerate(counts)))
    assert len(records) == 900
    found = {(r.partition, r.offset): kind_of(r) for r in records}
    poison = {(p, offset): kind for p, offset, kind in summary.poison}
    assert {at: kind for at, kind in found.items() if kind is not RecordKind.GOOD} == poison
    assert len(poison) == 270
    for kind in (RecordKind.INVALID_UTF8, RecordKind.INVALID_JSON, RecordKind.NULL_KEY):
        assert summary.kinds[kind] == 90
    assert summary.kinds[RecordKind.GOOD] == 630


def test_values_carry_key_seq_partition_and_newest_by_key_is_the_last_good_record(
    broker: EmbeddedBroker,
) -> None:
    config = KafkaConfig(broker.bootstrap)
    counts = [500, 300]
    summary = produce_profile(
        config, "small", explicit(counts, record_bytes=150), keys=4, poison=0.1, seed=3
    )
    newest: dict[str, tuple[int, int, bytes]] = {}
    last_seq: dict[str, int] = {}
    for record in read_all(config, "small", dict(enumerate(counts))):
        if record.key is None or kind_of(record) is not RecordKind.GOOD:
            continue
        value = json.loads(record.value)
        key = record.key.decode()
        assert value["key"] == key
        assert value["partition"] == record.partition
        assert value["seq"] > last_seq.get(key, -1)
        assert 140 <= len(record.value) <= 160
        last_seq[key] = value["seq"]
        newest[key] = (record.partition, record.offset, record.value)
    assert len(newest) == 8  # 4 keys in each partition, none shared
    expected = {k: (r.partition, r.offset, r.value) for k, r in summary.newest_by_key().items()}
    assert expected == newest


def test_the_same_seed_writes_the_same_records(broker: EmbeddedBroker) -> None:
    config = KafkaConfig(broker.bootstrap)
    profile = explicit([200, 100])
    first = produce_profile(config, "small", profile, keys=7, poison=0.05, seed=9)
    second = produce_profile(config, "twin", profile, keys=7, poison=0.05, seed=9)
    ends = {0: 200, 1: 100}
    assert read_all(config, "small", ends) == read_all(config, "twin", ends)
    assert first.kinds == second.kinds


def test_seed_002_large_records_fit_without_loss_when_compressed(broker: EmbeddedBroker) -> None:
    config = KafkaConfig(broker.bootstrap)
    profile = seed_002(scale=0.05)
    summary = produce_profile(config, "wide", profile, keys=1, compression="lz4")
    assert summary.truncated_partitions() == []
    assert watermarks(config, "wide", 24) == [(0, count) for count in profile.counts]


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_a_partition_filled_to_the_estimated_limit_keeps_every_record(
    broker: EmbeddedBroker, compression: str
) -> None:
    """check_fits's per-codec estimate is what lets `gen` refuse a profile the broker would cut."""
    count = PARTITION_BYTES_LIMIT // explicit([1]).stored_bytes(0, compression)
    topic = f"full-{compression}"
    broker.create_topic(topic, 1)
    profile = explicit([count])
    profile.check_fits(compression)
    summary = produce_profile(
        KafkaConfig(broker.bootstrap), topic, profile, compression=compression
    )
    assert summary.truncated_partitions() == []
    assert watermarks(KafkaConfig(broker.bootstrap), topic, 1) == [(0, count)]


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lagless", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_gen_command_prints_a_summary(
    broker: EmbeddedBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    profile_args = ["--profile", "seed-000", "--scale", "0.01", "--poison", "0.01"]
    code = main(["gen", "--bootstrap", broker.bootstrap, "--topic", "wide", *profile_args])
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("\n") == 1
    assert "produced 1,346 records" in out
    assert "to 16 partitions of 'wide'" in out
    assert "invalid-utf8 5, invalid-json 4, null-key 4" in out
    ends = [end for _, end in watermarks(KafkaConfig(broker.bootstrap), "wide", 24)]
    assert ends == list(seed_000(scale=0.01).counts)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--topic", "small", "--profile", "seed-000"], "has 4 partitions"),
        (["--topic", "absent", "--counts", "1,2"], "does not exist"),
        (["--topic", "small", "--counts", "1,x"], "not a comma-separated"),
        (["--topic", "small", "--counts", "1", "--poison", "2"], "between 0 and 1"),
        (["--topic", "small", "--counts", "90000"], "--compression lz4"),
    ],
)
def test_gen_bad_input_is_one_line_and_exit_2(
    broker: EmbeddedBroker, capfd: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["gen", "--bootstrap", broker.bootstrap, *args]) == 2
    out, err = capfd.readouterr()
    assert message in err
    assert err.count("\n") == 1
    assert out == ""


def test_gen_against_an_unreachable_bootstrap_fails_in_one_line() -> None:
    result = run_cli("gen", "--bootstrap", "127.0.0.1:1", "--topic", "t", "--counts", "1")
    assert result.returncode == 2
    assert result.stderr.startswith("lagless: error: cannot reach the broker at 127.0.0.1:1")
    assert result.stderr.count("\n") == 1


def test_broker_command_serves_clients_and_stops_cleanly_on_sigterm() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "lagless", "broker", "--brokers", "2", "--topic", "orders:3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        bootstrap = process.stdout.readline().strip()
        assert len(bootstrap.split(",")) == 2
        config = KafkaConfig(bootstrap)
        producer = Producer(config.producer())
        topics = producer.list_topics(timeout=10).topics
        assert len(topics["orders"].partitions) == 3
        producer.produce("orders", b"hello", b"k", partition=2)
        assert producer.flush(10) == 0
        assert watermarks(config, "orders", 3)[2] == (0, 1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        assert "Traceback" not in (process.stderr.read() if process.stderr else "")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--topic", ":3"], "has no name"),
        (["--brokers", "0"], "at least 1"),
        (["--topic", "a:2", "--topic", "a:3"], "given twice"),
        (["--topic", "a:x"], "not a number"),
        (["--retention-bytes", "6000000"], "the embedded broker (librdkafka's mock) keeps no"),
        (["--retention-ms", "0"], "argument --retention-ms: must be at least 1"),
    ],
)
def test_broker_bad_input_is_one_line_and_exit_2(
    capfd: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["broker", *args]) == 2
    out, err = capfd.readouterr()
    assert message in err
    assert err.count("\n") == 1
    assert out == ""


def test_broker_bad_input_exits_2_without_a_traceback_as_a_process() -> None:
    result = run_cli("broker", "--topic", ":3")
    assert result.returncode == 2
    assert result.stderr == "lagless: error: topic ':3' has no name (expected NAME:PARTITIONS)\n"


def test_the_broker_keeps_the_retention_it_is_given() -> None:
    """Issue 34.3: by size (below the mock's own 5 MB) and by time, the oldest records go, as
    Kafka's log cleaner deletes them; what is kept stays readable."""
    with EmbeddedBroker(
        topics={"sized": 1, "timed": 1}, retention_bytes=20_000, retention_ms=30_000
    ) as running:
        assert running.retention == (
            "keeps 20,000 bytes a partition, and records newer than 30,000 ms"
        )
        config = KafkaConfig(running.bootstrap)
        producer = Producer(config.producer())
        for n in range(1000):  # 100 KB of values: 80 % past the size
            producer.produce("sized", b"v" * 98, b"%02d" % (n % 100), partition=0)
        old = int(time.time() * 1000) - 120_000
        for n in range(100):  # two minutes old: past the time
            producer.produce("timed", b"old", partition=0, timestamp=old + n)
        for _ in range(50):
            producer.produce("timed", b"new", partition=0)
        assert producer.flush(10) == 0

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            (sized,) = watermarks(config, "sized", 1)
            (timed,) = watermarks(config, "timed", 1)
            if sized[0] >= 800 and timed[0] == 100:
                break
            time.sleep(0.2)

    assert sized == (800, 1000)  # 200 records of 100 B: 20,000 bytes
    assert timed == (100, 150)


def test_the_broker_retention_outlives_a_broker_away(caplog: pytest.LogCaptureFixture) -> None:
    """A broker set down fails the retention thread's passes, not the thread: it says so once,
    and enforces the limit again when the broker is back."""
    caplog.set_level("INFO", logger="lagless.broker.retention")
    with EmbeddedBroker(topics={"sized": 1}, retention_bytes=20_000) as running:
        time.sleep(1)  # the thread has connected
        running.set_down()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not waiting_for_the_broker(caplog):
            time.sleep(0.2)  # until a pass has failed
        running.set_up()
        config = KafkaConfig(running.bootstrap)
        producer = Producer(config.producer())
        for n in range(1000):
            producer.produce("sized", b"v" * 98, b"%02d" % (n % 100), partition=0)
        assert producer.flush(10) == 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ((low, high),) = watermarks(config, "sized", 1)
            if low >= 800:
                break
            time.sleep(0.2)

    assert (low, high) == (800, 1000)
    assert len(waiting_for_the_broker(caplog)) == 1
    assert any("the broker is back" in r.getMessage() for r in caplog.records)


def waiting_for_the_broker(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "waits for the broker" in r.getMessage()]
