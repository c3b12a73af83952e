"""Committed offsets the log no longer agrees with, made on noida-db as they happen in a shop:
a topic deleted and created again with fewer records (offsets past the log's end), retention
deleting records the group had not read (DeleteRecords: offsets behind the log start), a topic
deleted for good. Each is a status of its own, never OK, and `lag`, `doctor --json` and
`serve`'s API say the same word, the doctor with the fix. A group that never committed is
shown so by serve, with no traceback."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from lagless.cli.main import main
from lagless.kafka.config import KafkaConfig
from lagless.kafka.group_offsets import GroupOffsets
from lagless.kafka.offset_reader import OffsetReader
from tests.harness.live_group import create_topic
from tests.harness.noida import NoidaKafka
from tests.harness.serve import get_json, lagless_serve_process, wait_for

RECORDS = 250
TIMEOUT_S = 30


def commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(topic, p, o) for p, o in offsets.items()]
    )
    admin.alter_consumer_group_offsets([request])[group].result(TIMEOUT_S)


def delete_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(TIMEOUT_S)
    deadline = time.monotonic() + TIMEOUT_S
    while topic in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"{topic} still listed"
        time.sleep(0.1)


def cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    code = main([*args, "--json"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    return json.loads(printed.out)


@pytest.fixture(scope="module")
def broken(noida: NoidaKafka) -> dict[str, str]:
    """Three groups on noida-db, each with one kind of broken offset: {kind: group}."""
    tag = uuid.uuid4().hex[:6]
    bootstrap = noida.bootstrap
    recreated, trimmed, deleted = (f"{kind}-{tag}" for kind in ("recreated", "trimmed", "gone"))
    groups = {"AHEAD": f"g-{recreated}", "LOST": f"g-{trimmed}", "GONE": f"g-{deleted}"}
    # The topic recreated with fewer records: the group committed at 5,000 of the old log.
    create_topic(bootstrap, recreated, 2, 5000)
    commit(bootstrap, groups["AHEAD"], recreated, {0: 5000, 1: 5000})
    delete_topic(bootstrap, recreated)
    create_topic(bootstrap, recreated, 2, RECORDS)
    # Retention (here DeleteRecords) passed the committed offset.
    create_topic(bootstrap, trimmed, 1, RECORDS)
    commit(bootstrap, groups["LOST"], trimmed, {0: 50})
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(trimmed, 0, 100)]).values():
        future.result(TIMEOUT_S)
    # The topic deleted for good.
    create_topic(bootstrap, deleted, 1, RECORDS)
    commit(bootstrap, groups["GONE"], deleted, {0: 10})
    delete_topic(bootstrap, deleted)
    return groups


EXPECTED = {
    "AHEAD": ("offset-ahead", "committed 5,000, the log ends at 250"),
    "LOST": ("records-lost", "retention deleted 50 records the group had not read"),
    "GONE": ("topic-gone", "that no longer exist"),
}


def test_lag_doctor_and_serve_say_the_same_word_for_each_broken_offset(
    noida: NoidaKafka, broken: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    window = ("--window", "0.5")  # the same window for the three: the same word
    named = [arg for group in broken.values() for arg in ("--group", group)]
    with lagless_serve_process(noida.bootstrap, *named, "--interval", "0.2", *window) as (
        url,
        _,
    ):
        for status, group in broken.items():
            kind, words = EXPECTED[status]
            where = ("--bootstrap", noida.bootstrap, "--group", group)
            shown = cli_json(capsys, "lag", *where, *window)
            diagnosed = cli_json(capsys, "doctor", *where, "--seconds", "0.5")
            served = wait_for(
                "a sample",
                lambda g=group: (
                    (s := get_json(f"{url}/api/groups/{g}")["status"])["sampled_at"] and s
                ),
            )
            assert shown["status"] == diagnosed["status"] == served["status"] == status
            assert {p["status"] for p in shown["partitions"]} == {status}
            assert [p["status"] for p in served["partitions"]] == [
                p["status"] for p in shown["partitions"]
            ]
            finding = next(f for f in diagnosed["findings"] if f["kind"] == kind)
            assert words in finding["text"] and finding["fix"]
            assert "healthy" not in {f["kind"] for f in diagnosed["findings"]}
            assert [f["text"] for f in served["findings"] if f["kind"] == kind] == [finding["text"]]


def test_a_group_that_never_committed_is_shown_so_without_a_traceback(
    noida: NoidaKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    """`serve --group nobody` printed a 19-line ValueError from its retention thread."""
    group = f"nobody-{uuid.uuid4().hex[:6]}"
    with lagless_serve_process(noida.bootstrap, "--group", group, "--interval", "0.2") as (
        url,
        process,
    ):
        status = wait_for(
            "a few rounds",
            lambda: (s := get_json(f"{url}/api/groups/{group}")["status"])["sampled_at"] and s,
        )
        time.sleep(1.0)
    assert status["status"] == "NO_COMMITS" and status["error"] is None
    assert process.stderr_text is not None and "Traceback" not in process.stderr_text
    assert main(["lag", "--bootstrap", noida.bootstrap, "--group", group]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(f"group {group!r} has no committed offsets on any topic")
    )


def test_an_import_commits_its_group_marked_so_the_doctor_speaks_of_the_import(
    noida: NoidaKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    """lagless import's --group: its commits carry lagless's mark, and a stopped import's group
    is told to start the import again, not to check its consumers or to use lagless."""
    tag = uuid.uuid4().hex[:6]
    topic, group = f"imported-{tag}", f"import-{tag}"
    create_topic(noida.bootstrap, topic, 2, RECORDS)
    with OffsetReader(KafkaConfig(noida.bootstrap)) as reader:
        assert isinstance(reader.groups, GroupOffsets)
        reader.groups.commit(group, {(topic, 0): 100, (topic, 1): RECORDS})
    diagnosed = cli_json(
        capsys, "doctor", "--bootstrap", noida.bootstrap, "--group", group, "--seconds", "0.5"
    )
    assert diagnosed["status"] == "STOP"
    stop = next(f for f in diagnosed["findings"] if f["kind"] == "stop")
    assert f"no lagless import is committing group {group} now" in stop["text"]
    assert stop["fix"].startswith("run the same import again: it resumes from what its table")
    assert diagnosed["notes"] == []  # an import has no members: nothing to note about them
    assert all("with lagless" not in f["fix"] for f in diagnosed["findings"])
    assert "drained-and-lagging" not in {f["kind"] for f in diagnosed["findings"]}

    # A consumer commits too (field report 000's group: partitions an import drained, others
    # its consumers read): the group is consumers' again.
    commit(noida.bootstrap, group, topic, {0: 120})
    diagnosed = cli_json(
        capsys, "doctor", "--bootstrap", noida.bootstrap, "--group", group, "--seconds", "0.5"
    )
    stop = next(f for f in diagnosed["findings"] if f["kind"] == "stop")
    assert "lagless import" not in stop["text"] and "consumers" in stop["fix"]
