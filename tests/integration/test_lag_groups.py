"""Real consumer groups on the embedded broker, driven into each state lag and doctor must see."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from lagless.broker import EmbeddedBroker
from lagless.cli.main import main
from lagless.kafka.config import KafkaConfig
from lagless.lag.doctor import diagnose, examine, notes
from lagless.lag.members import KafkaMembership
from lagless.lag.offsets import KafkaOffsetSource
from lagless.lag.report import History, build_report, collect
from lagless.lag.status import Status

RECORDS_PER_PARTITION = 20


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    topics = {"lagging": 4, "stuck": 2, "rewound": 1, "shared": 2}
    with EmbeddedBroker(topics=topics) as running:
        producer = Producer({"bootstrap.servers": running.bootstrap})
        for topic, partitions in topics.items():
            for partition in range(partitions):
                for number in range(RECORDS_PER_PARTITION):
                    producer.produce(topic, f"{topic}-{number}".encode(), partition=partition)
        producer.flush(10)
        yield running


def group_consumer(broker: EmbeddedBroker, group: str) -> Consumer:
    """A group member whose rebalances settle in seconds on a loaded machine.

    The embedded broker holds a rebalance open until every member has rejoined or the
    session timeout (librdkafka's default 45 s) has passed; a member that learns of the
    rebalance late (it heartbeats every 3 s by default) kept a three-member group from
    settling within 20 s once in CI. Short heartbeats and session bound that wait.
    """
    return Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )


def commit(consumer: Consumer, topic: str, offsets: dict[int, int]) -> None:
    consumer.commit(
        offsets=[TopicPartition(topic, p, offset) for p, offset in offsets.items()],
        asynchronous=False,
    )


def commit_what_each_holds(consumers: list[Consumer], deadline: float) -> None:
    """Each member commits the end of the partition it holds, until both partitions are
    committed: a rebalance still settling (a member joined a moment late, or missed a
    heartbeat on a loaded machine) refuses commits or leaves a member holding nothing for a
    moment, so poll and try again, as members do."""
    committed: set[int] = set()
    while committed != {0, 1}:
        assert time.monotonic() < deadline, f"the group did not settle: committed {committed}"
        try:
            for consumer in consumers:
                for partition in consumer.assignment():
                    commit(consumer, "shared", {partition.partition: RECORDS_PER_PARTITION})
                    committed.add(partition.partition)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.REBALANCE_IN_PROGRESS:
                raise
        for consumer in consumers:
            consumer.poll(0.1)


def lag_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    """`lag --json`; one sample unless the caller gives a --window."""
    window = () if "--window" in args else ("--window", "0")
    assert main(["lag", "--json", *window, *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_lagging_partitions_json_lag_is_end_minus_committed(
    broker: EmbeddedBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    consumer = group_consumer(broker, "lagging-group")
    consumer.assign([TopicPartition("lagging", p, 0) for p in range(4)])
    next_offsets = dict.fromkeys(range(4), 0)
    for _ in range(30):
        message = consumer.poll(5)
        assert message is not None and message.error() is None
        partition, offset = message.partition(), message.offset()
        assert partition is not None and offset is not None
        next_offsets[partition] = offset + 1
    next_offsets[3] = 5
    commit(consumer, "lagging", next_offsets)
    consumer.close()

    shown = lag_json(capsys, "--bootstrap", broker.bootstrap, "--group", "lagging-group")

    partitions = shown["partitions"]
    assert [(p["topic"], p["partition"]) for p in partitions] == [("lagging", p) for p in range(4)]
    for partition in partitions:
        assert partition["end"] == RECORDS_PER_PARTITION
        assert partition["lag"] == partition["end"] - partition["committed"]
    assert [p["committed"] for p in partitions] == [next_offsets[p] for p in range(4)]
    assert shown["total_lag"] == sum(p["lag"] for p in partitions) > 0
    lagging = [p for p in partitions if p["lag"] > 0]
    assert all(p["lag_seconds"] is not None and p["lag_seconds"] > 0 for p in lagging)


def test_text_table_follows_the_seed_columns_with_all_row_first(
    broker: EmbeddedBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    consumer = group_consumer(broker, "table-group")
    commit(consumer, "stuck", {0: 4})
    consumer.close()

    args = ["lag", "--bootstrap", broker.bootstrap, "--group", "table-group", "--window", "0"]
    assert main([*args, "--markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()

    assert [cell.strip() for cell in lines[0].strip("|").split("|")] == [
        "partition", "lag", "pos", "end", "lag_s", "status",
    ]  # fmt: skip
    assert lines[2].split("|")[1:5] == ["All", "36", "4", "40"]
    assert lines[3].split("|")[1:5] == ["0", "16", "4", "20"]
    assert lines[4].split("|")[1:5] == ["1", "20", "-", "20"], "never committed: from log start"


def test_a_stalled_partition_shows_stall_in_lag_and_doctor_says_it_is_stuck(
    broker: EmbeddedBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    """Over the same window (lag's --window, the doctor's --seconds), the same word."""
    consumer = group_consumer(broker, "stalled-group")
    commit(consumer, "stuck", {0: 7, 1: RECORDS_PER_PARTITION})
    try:
        shown = lag_json(
            capsys, "--bootstrap", broker.bootstrap, "--group", "stalled-group", "--window", "0.4"
        )
        assert [p["status"] for p in shown["partitions"]] == ["STALL", "OK"]
        assert shown["status"] == "STALL"

        assert main(
            ["doctor", "--bootstrap", broker.bootstrap, "--group", "stalled-group",
             "--seconds", "0.4"]
        ) == 0  # fmt: skip
        report = capsys.readouterr().out
    finally:
        consumer.close()
    assert "status STALL (watched 0.4 s)" in report
    assert "stuck:0: lag but the committed offset stopped moving" in report
    assert "1 partition is drained while 1 lag (stuck:0)" in report
    assert "\nnote: which consumer holds which partitions" in report  # a note, no finding
    assert "the broker does not answer DescribeGroups" in report


def test_a_rewound_commit_shows_rewind_in_lag_and_doctor(broker: EmbeddedBroker) -> None:
    config = KafkaConfig(broker.bootstrap)
    consumer = group_consumer(broker, "rewound-group")
    commit(consumer, "rewound", {0: 15})
    commits = iter([9, 3])

    def sleep_then_commit_older(seconds: float) -> None:
        time.sleep(seconds)
        commit(consumer, "rewound", {0: next(commits)})

    try:
        source = KafkaOffsetSource(config, "rewound-group")
        history = History(keep_s=5)
        collect(source, history, 0.4, 0.2, sleep=sleep_then_commit_older)
        report = build_report("rewound-group", history, window_s=5)
        assert [s.committed for s in history.samples[("rewound", 0)]] == [15, 9, 3]
        assert report.rows[0].status is Status.REWIND
        assert report.rows[0].lag == RECORDS_PER_PARTITION - 3

        commits = iter([2, 2])
        exam = examine(
            "rewound-group", source, KafkaMembership(config), 0.4, 0.2, sleep_then_commit_older
        )
        source.close()
    finally:
        consumer.close()
    findings = {finding.kind: finding for finding in diagnose(exam)}
    assert "from 3 to 2" in findings["rewind"].text
    assert "DescribeGroups" in notes(exam)[0]


def test_an_idle_consumer_in_a_real_group(
    broker: EmbeddedBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three members subscribe to a two-partition topic: one gets nothing to read.

    The embedded broker does not answer DescribeGroups, so the doctor must note it could not
    check for idle consumers rather than fail; test_doctor_live checks the finding on noida-db.
    """
    consumers = [group_consumer(broker, "idle-group") for _ in range(3)]
    for consumer in consumers:
        consumer.subscribe(["shared"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for consumer in consumers:
            consumer.poll(0.1)
        if sum(len(c.assignment()) for c in consumers) == 2:
            break
    try:
        sizes = sorted(len(c.assignment()) for c in consumers)
        assert sizes == [0, 1, 1]
        commit_what_each_holds(consumers, deadline)
        shown = lag_json(capsys, "--bootstrap", broker.bootstrap, "--group", "idle-group")
        assert [(p["lag"], p["status"]) for p in shown["partitions"]] == [(0, "OK"), (0, "OK")]

        assert main(
            ["doctor", "--bootstrap", broker.bootstrap, "--group", "idle-group", "--seconds", "0.4"]
        ) == 0  # fmt: skip
        report = capsys.readouterr().out
    finally:
        for consumer in consumers:
            consumer.close()
    assert "idle consumers, the assignor and rebalances were not checked" in report


def test_unknown_group_is_one_line_and_exit_2(
    broker: EmbeddedBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in ("lag", "doctor"):
        code = main([command, "--bootstrap", broker.bootstrap, "--group", "nobody-home"])
        error = capsys.readouterr().err
        assert code == 2
        assert (
            error == "lagless: error: group 'nobody-home' has no committed offsets on any topic\n"
        )


def test_unreachable_broker_is_one_line_and_exit_2_within_seconds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    started = time.monotonic()
    code = main(["lag", "--bootstrap", "127.0.0.1:9", "--group", "g"])
    assert code == 2
    assert time.monotonic() - started < 10
    error = capsys.readouterr().err
    assert error.startswith("lagless: error: cannot reach the broker at 127.0.0.1:9 within")
    assert error.count("\n") == 1


def test_a_group_on_the_new_consumer_protocol_is_read_as_any_other(
    broker: EmbeddedBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    """KIP-848's protocol (group.protocol=consumer: ConsumerGroupHeartbeat, which the embedded
    broker answers): the group's committed offsets are read as a classic group's. Neither
    broker here answers ConsumerGroupDescribe, so its members are not told (docs say so)."""
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "kip848-group",
         "group.protocol": "consumer", "enable.auto.commit": False,
         "auto.offset.reset": "earliest"}
    )  # fmt: skip
    consumer.subscribe(["rewound"])
    try:
        deadline, read = time.monotonic() + 20, 0
        while read < 5:
            assert time.monotonic() < deadline, "the new protocol's member read nothing"
            message = consumer.poll(0.5)
            read += message is not None and message.error() is None
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition("rewound", 0)], timeout=10)[0].offset
        shown = lag_json(capsys, "--bootstrap", broker.bootstrap, "--group", "kip848-group")
    finally:
        consumer.close()
    assert committed >= 5
    (partition,) = shown["partitions"]
    assert (partition["committed"], partition["lag"]) == (
        committed,
        RECORDS_PER_PARTITION - committed,
    )
