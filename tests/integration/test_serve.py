"""`lagless serve` against real groups on the embedded broker, over TCP, in its own process.

The embedded broker answers neither ListGroups, DescribeGroups nor DescribeConfigs, so here
the group state and retention.ms are absent (tests/unit/test_serve_sampler.py and
test_serve_metrics.py cover them with fakes of those calls) and every group is named.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from lagless.broker import EmbeddedBroker
from lagless.cli.main import main
from tests.harness.serve import (
    get,
    get_json,
    lagless_serve,
    metric,
    parse_metrics,
    prometheus,
    promql,
    wait_for,
)

RECORDS = 20
# When the records of topic "timed" were written: long enough ago that an error in the time
# lag cannot hide in the few seconds a test takes.
TIMED_AGO_S = 600.0
FAST = ("--interval", "0.2", "--window", "1")


def produce(bootstrap: str, topic: str, partitions: int, timestamps_ms: list[int] | None = None):  # type: ignore[no-untyped-def]
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition in range(partitions):
        for number in range(RECORDS):
            producer.produce(
                topic,
                f"{topic}-{number}".encode(),
                partition=partition,
                timestamp=timestamps_ms[number] if timestamps_ms else 0,
            )
    producer.flush(10)


def commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    consumer.commit(
        offsets=[TopicPartition(topic, p, offset) for p, offset in offsets.items()],
        asynchronous=False,
    )
    consumer.close()


def broker_truth(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """end - committed per partition, asked of the broker directly."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        committed = consumer.committed(
            [TopicPartition(topic, p) for p in range(partitions)], timeout=10
        )
        return {
            tp.partition: consumer.get_watermark_offsets(
                TopicPartition(topic, tp.partition), timeout=10, cached=False
            )[1]
            - tp.offset
            for tp in committed
        }
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(topics={"orders": 2, "timed": 1, "retained": 1}) as running:
        produce(running.bootstrap, "orders", 2)
        written = time.time() - TIMED_AGO_S
        produce(running.bootstrap, "timed", 1, [int((written + n) * 1000) for n in range(RECORDS)])
        produce(running.bootstrap, "retained", 1)
        yield running


def test_prometheus_scrapes_a_lag_equal_to_end_minus_committed(broker: EmbeddedBroker) -> None:
    """A real Prometheus scrapes `lagless serve`; PromQL returns the broker's end - committed."""
    commit(broker.bootstrap, "prom-group", "orders", {0: 4, 1: 15})
    truth = broker_truth(broker.bootstrap, "prom-group", "orders", 2)
    assert truth == {0: RECORDS - 4, 1: RECORDS - 15}

    with (
        lagless_serve(broker.bootstrap, "--group", "prom-group", *FAST) as url,
        prometheus(url.removeprefix("http://")) as prom,
    ):
        query = 'kafka_consumergroup_group_lag{group="prom-group",topic="orders"}'
        result = wait_for("the lag in Prometheus", lambda: len(promql(prom, query)) == 2)
        assert result
        lags = {int(r["metric"]["partition"]): float(r["value"][1]) for r in promql(prom, query)}
        assert lags == truth
        # The same lag from the offsets Prometheus holds: end - committed in PromQL.
        difference = promql(
            prom,
            'kafka_partition_latest_offset{topic="orders"} - on(topic, partition) '
            'kafka_consumergroup_group_offset{group="prom-group"}',
        )
        assert {int(r["metric"]["partition"]): float(r["value"][1]) for r in difference} == truth
        total = promql(prom, 'kafka_consumergroup_group_sum_lag{group="prom-group"}')
        assert float(total[0]["value"][1]) == sum(truth.values())
        # Nothing commits: once the window passes, the group's status is STOP.
        stopped = 'lagless_consumergroup_status{group="prom-group",status="STOP"} == 1'
        assert wait_for("STOP in Prometheus", lambda: promql(prom, stopped))


def test_time_lag_of_a_stopped_group_is_within_a_second_of_the_truth(
    broker: EmbeddedBroker,
) -> None:
    """The group stopped at offset 5 of "timed", whose record was written at a known time;
    its time lag is now minus that time, and it stays reported as STOP once the window passes
    without a commit."""
    commit(broker.bootstrap, "timed-group", "timed", {0: 5})
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "reader"})
    consumer.assign([TopicPartition("timed", 0, 5)])
    record = consumer.poll(10)
    assert record is not None and record.error() is None
    written_at = record.timestamp()[1] / 1000
    consumer.close()

    with lagless_serve(broker.bootstrap, "--group", "timed-group", *FAST) as url:
        before = time.time()
        # The record at the committed offset is read beside the sampling rounds: its exact
        # time lag shows from a round or two after the first.
        detail = wait_for(
            "the group's exact time lag",
            lambda: [
                p
                for p in get_json(url + "/api/groups/timed-group")["status"]["partitions"]
                if p["lag_seconds_method"] == "exact"
            ],
        )
        after = time.time()
        partition = detail[0]
        truth_low, truth_high = before - written_at, after - written_at
        assert truth_low - 1 <= partition["lag_seconds"] <= truth_high + 1

        before = time.time()
        samples = parse_metrics(get(url + "/metrics")[1])
        after = time.time()
        seconds = metric(
            samples, "kafka_consumergroup_group_lag_seconds", group="timed-group", method="exact"
        )
        assert seconds is not None
        assert before - written_at - 1 <= seconds <= after - written_at + 1
        error_s = abs(seconds - ((before + after) / 2 - written_at))
        print(
            f"time lag {seconds:.3f} s, truth {(before + after) / 2 - written_at:.3f} s "
            f"(error {error_s * 1000:.0f} ms, scrape took {(after - before) * 1000:.0f} ms)"
        )

        stopped = wait_for(
            "the group to show STOP",
            lambda: get_json(url + "/api/groups/timed-group")["status"]["status"] == "STOP",
            timeout_s=10,
        )
        assert stopped
        groups = get_json(url + "/api/groups")["groups"]
        assert [g["group"] for g in groups] == ["timed-group"]
        samples = parse_metrics(get(url + "/metrics")[1])
        assert (
            metric(samples, "lagless_consumergroup_status", group="timed-group", status="STOP") == 1
        )
        assert metric(samples, "kafka_consumergroup_group_lag", group="timed-group") == RECORDS - 5


def test_retention_warning_as_the_log_start_approaches_the_committed_offset(
    broker: EmbeddedBroker,
) -> None:
    """The mock cluster answers no DeleteRecords request (AdminClient.delete_records gets
    UNSUPPORTED_FEATURE), so the log start is moved with its own control,
    rd_kafka_mock_partition_delete_records, as retention would: the broker then reports the
    new log start in ListOffsets, which is all lagless reads."""
    commit(broker.bootstrap, "retained-group", "retained", {0: 15})
    with lagless_serve(
        broker.bootstrap, "--group", "retained-group", "--retention-warning", "3600", *FAST
    ) as url:
        wait_for("a first sample", lambda: get_json(url + "/api/groups")["groups"][0]["status"])
        codes = [
            f["kind"] for f in get_json(url + "/api/groups/retained-group")["status"]["findings"]
        ]
        assert "retention-risk" not in codes, "the log start has not moved yet"

        for before_offset in (5, 10, 13):
            broker.delete_records("retained", 0, before_offset)
            time.sleep(0.3)

        def warned() -> dict | None:
            status = get_json(url + "/api/groups/retained-group")["status"]
            found = {f["kind"]: f for f in status["findings"]}
            risk = found.get("retention-risk")
            # It warns from the first deletion on; wait for the one that left 2 records.
            return risk if risk and "has 2 records between the log start" in risk["text"] else None

        finding = wait_for("a retention warning", warned, timeout_s=30)
        assert finding["text"].startswith("retained:0: retention will delete records")
        samples = parse_metrics(get(url + "/metrics")[1])
        where = {"group": "retained-group", "topic": "retained", "partition": 0}
        assert metric(samples, "lagless_consumergroup_retention_margin_records", **where) == 2
        assert metric(samples, "lagless_consumergroup_retention_at_risk", **where) == 1
        left = metric(
            samples, "lagless_consumergroup_retention_margin_seconds", **where, basis="rate"
        )
        assert left is not None and 0 < left < 60
        assert (
            metric(samples, "kafka_partition_earliest_offset", topic="retained", partition=0) == 13
        )

        broker.delete_records("retained", 0, 18)
        lost = wait_for(
            "records lost",
            lambda: {
                f["kind"]: f
                for f in get_json(url + "/api/groups/retained-group")["status"]["findings"]
            }.get("records-lost"),
            timeout_s=5,
        )
        assert "retention deleted 3 records the group had not read" in lost["text"]


def test_lag_prometheus_prints_the_metrics_of_serve_once(
    broker: EmbeddedBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    commit(broker.bootstrap, "once-group", "orders", {0: 7, 1: 20})
    code = main(
        ["lag", "--prometheus", "--bootstrap", broker.bootstrap, "--group", "once-group",
         "--window", "0.4", "--cluster-name", "local"]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    samples = parse_metrics(printed)
    assert metric(samples, "kafka_consumergroup_group_lag", group="once-group", partition=0) == 13
    assert metric(samples, "kafka_consumergroup_group_lag", group="once-group", partition=1) == 0
    assert metric(samples, "kafka_consumergroup_group_sum_lag", cluster_name="local") == 13

    with lagless_serve(broker.bootstrap, "--group", "once-group", *FAST) as url:
        served = wait_for(
            "a sampled group's metrics",
            lambda: (
                (found := parse_metrics(get(url + "/metrics")[1]))
                and metric(found, "kafka_consumergroup_group_sum_lag") is not None
                and found
            ),
        )
    served_names = {name for name, _ in served} - {"kafka_consumergroup_poll_time_ms"}
    assert served_names == {name for name, _ in samples}


def test_the_server_keeps_serving_while_the_broker_is_down_and_recovers() -> None:
    with EmbeddedBroker(topics={"orders": 1}) as broker:
        produce(broker.bootstrap, "orders", 1)
        commit(broker.bootstrap, "outage-group", "orders", {0: 8})
        with lagless_serve(broker.bootstrap, "--group", "outage-group", *FAST) as url:

            def up() -> float | None:
                return metric(parse_metrics(get(url + "/metrics")[1]), "lagless_consumergroup_up")

            wait_for("a first sample", lambda: up() == 1)
            lag = metric(parse_metrics(get(url + "/metrics")[1]), "kafka_consumergroup_group_lag")
            assert lag == RECORDS - 8
            broker.set_down()
            down_at, down_wall = time.monotonic(), time.time()
            wait_for("the outage to show", lambda: up() == 0, timeout_s=60)
            status = get_json(url + "/api/groups/outage-group")["status"]
            assert status["error"], "the API says why the group is not sampled"
            assert status["status"] == "UNKNOWN", "never the last OK while the broker is away"
            assert down_wall - 1 <= status["error_since"] <= time.time(), "since when it fails"
            assert [f["kind"] for f in status["findings"]] == ["unknown"]
            listed = get_json(url + "/api/groups")["groups"][0]
            assert (listed["status"], listed["error"]) == ("UNKNOWN", status["error"])
            samples = parse_metrics(get(url + "/metrics")[1])
            assert metric(samples, "kafka_consumergroup_group_lag", group="outage-group") == lag, (
                "the last lag seen stays reported, flagged by lagless_consumergroup_up 0"
            )
            assert metric(samples, "lagless_consumergroup_status", status="UNKNOWN") == 1
            assert metric(samples, "lagless_consumergroup_status", status="OK") == 0
            assert get(url + "/")[0] == 200
            time.sleep(max(0.0, 1 - (time.monotonic() - down_at)))

            broker.set_up()
            up_at = time.monotonic()
            wait_for("sampling to recover", lambda: up() == 1, timeout_s=90)
            recovered_s = time.monotonic() - up_at
            print(f"recovered {recovered_s:.1f} s after the broker came back")
            recovered = get_json(url + "/api/groups/outage-group")["status"]
            assert recovered["error"] is None and recovered["error_since"] is None

            def judged() -> str | None:
                status = get_json(url + "/api/groups/outage-group")["status"]["status"]
                return status if status in ("STALL", "STOP") else None

            # Samples from before the outage may have left the window: the group is judged
            # again (lag and a commit that never moves) once the window holds new ones.
            # (The waits' deadlines are generous: a loaded CI worker samples late.)
            wait_for("the stuck group to be judged again", judged, timeout_s=60)


def one_line_exit_2(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    started = time.monotonic()
    assert main(["serve", *args]) == 2
    assert time.monotonic() - started < 10
    error = capsys.readouterr().err
    assert error.startswith("lagless: error: ") and error.count("\n") == 1, error
    return error


def test_a_named_group_without_commits_is_shown_so_until_it_commits(
    broker: EmbeddedBroker,
) -> None:
    """`serve --group A --group B` starts though B has committed nothing yet; B is shown as
    NO_COMMITS (not OK with lag 0), then judged once it commits."""
    commit(broker.bootstrap, "early-group", "orders", {0: 4, 1: 4})
    with lagless_serve(
        broker.bootstrap, "--group", "early-group", "--group", "late-group", *FAST
    ) as url:

        def statuses() -> dict[str, str]:
            return {g["group"]: g["status"] for g in get_json(url + "/api/groups")["groups"]}

        wait_for("a first sample", lambda: statuses()["early-group"] != "UNKNOWN")
        assert statuses()["late-group"] == "NO_COMMITS"
        late = get_json(url + "/api/groups/late-group")["status"]
        assert (late["partition_count"], late["error"]) == (0, None)
        samples = parse_metrics(get(url + "/metrics")[1])
        assert metric(samples, "lagless_consumergroup_status", group="late-group",
                      status="NO_COMMITS") == 1  # fmt: skip
        assert metric(samples, "lagless_consumergroup_up", group="late-group") == 1

        commit(broker.bootstrap, "late-group", "orders", {0: 15})
        wait_for("the late group's first commit", lambda: statuses()["late-group"] != "NO_COMMITS")
        late = get_json(url + "/api/groups/late-group")["status"]
        assert late["partition_count"] == 2 and late["totallag"] == (RECORDS - 15) + RECORDS


def test_unreachable_broker_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    error = one_line_exit_2(capsys, "--bootstrap", "127.0.0.1:9", "--group", "g", "--port", "0")
    assert "cannot reach the broker at 127.0.0.1:9" in error
    error = one_line_exit_2(capsys, "--bootstrap", "127.0.0.1:9", "--port", "0")
    assert "cannot reach the broker at 127.0.0.1:9" in error


def test_port_in_use_is_one_line_and_exit_2(
    broker: EmbeddedBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    commit(broker.bootstrap, "port-group", "orders", {0: 1})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        error = one_line_exit_2(
            capsys, "--bootstrap", broker.bootstrap, "--group", "port-group", "--port", str(port)
        )
    assert error == f"lagless: error: port {port} on 127.0.0.1 is in use\n"


def test_other_bad_input_is_one_line_and_exit_2(
    broker: EmbeddedBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    error = one_line_exit_2(capsys, "--bootstrap", broker.bootstrap, "--port", "0")
    assert "does not answer ListGroups" in error and "--group" in error
    for interval in ("0", "nan", "inf"):
        error = one_line_exit_2(capsys, "--bootstrap", broker.bootstrap, "--interval", interval)
        assert "--interval must be a positive number" in error
    error = one_line_exit_2(capsys, "--bootstrap", broker.bootstrap, "--window", "nan")
    assert "--window must be a positive number" in error
    error = one_line_exit_2(capsys, "--bootstrap", broker.bootstrap, "--port", "70000")
    assert "--port 70000 is not a port" in error
