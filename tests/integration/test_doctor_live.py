"""The doctor's group-membership rules on live groups: real confluent_kafka consumers in a real
group coordinator (noida-db's Kafka, tests/harness/noida.py), diagnosed through the CLI as a
user runs it. Nothing is faked here; tests/unit/test_lag_doctor.py keeps only the shapes no
broker here produces on demand (seed 000's 24 partitions of millions of records)."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import pytest

from lagless.cli.main import main
from lagless.kafka.config import KafkaConfig
from lagless.lag.doctor import diagnose, examine
from lagless.lag.members import KafkaMembership
from lagless.lag.offsets import KafkaOffsetSource
from tests.harness.live_group import create_topic, kinds, live_group
from tests.harness.noida import NoidaKafka
from tests.harness.serve import get_json, lagless_serve, wait_for

RECORDS = 10
_names = itertools.count()


def names(what: str) -> tuple[str, str]:
    number = next(_names)
    return f"{what}-topic-{number}", f"{what}-group-{number}"


def doctor_json(capsys: pytest.CaptureFixture[str], noida: NoidaKafka, group: str) -> dict:
    code = main(
        ["doctor", "--json", "--bootstrap", noida.bootstrap, "--group", group, "--seconds", "1"]
    )
    printed = capsys.readouterr()
    assert code == 0, printed.err
    return json.loads(printed.out)


def by_kind(body: dict) -> dict[str, dict]:
    return {finding["kind"]: finding for finding in body["findings"]}


def test_more_consumers_than_partitions_leaves_an_idle_consumer(
    noida: NoidaKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    topic, group = names("idle")
    create_topic(noida.bootstrap, topic, 2, RECORDS)
    with live_group(noida.bootstrap, group, topic) as members:
        consumers = [members.join("cooperative-sticky") for _ in range(3)]
        held = members.settle(2)
        assert sorted(len(h) for h in held) == [0, 1, 1]
        for consumer, partitions in zip(consumers, held, strict=True):
            if partitions:
                members.commit(consumer, dict.fromkeys(partitions, RECORDS))
        body = doctor_json(capsys, noida, group)
    assert set(body) == {"group", "status", "findings", "notes"} and body["group"] == group
    assert all(set(f) == {"kind", "text", "fix"} for f in body["findings"])
    assert body["notes"] == []  # noida answers DescribeGroups: nothing went unchecked
    assert kinds(body["findings"]) == ["idle-consumers"]
    assert by_kind(body)["idle-consumers"]["text"] == (
        "1 of 3 consumers hold no partition: more consumers than partitions (3 > 2)."
    )
    assert body["status"] == "OK"


def test_range_piles_the_lagging_partitions_and_is_an_eager_protocol(
    noida: NoidaKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    """range over 4 partitions and 2 members: one holds 0-1, the other 2-3; the first lags on
    both, the second has drained both."""
    topic, group = names("range")
    create_topic(noida.bootstrap, topic, 4, RECORDS)
    with live_group(noida.bootstrap, group, topic) as members:
        consumers = [members.join("range"), members.join("range")]
        held = members.settle(4)
        assert sorted(held) == [[0, 1], [2, 3]]
        piled, spare = (consumers[held.index(partitions)] for partitions in ([0, 1], [2, 3]))
        members.commit(piled, {0: 2, 1: 3})
        members.commit(spare, {2: RECORDS, 3: RECORDS})
        body = doctor_json(capsys, noida, group)
    found = by_kind(body)
    assert (
        "the range assignor piled the lagging partitions on 1 consumers while 1 hold none"
        in (found["range-piling"]["text"])
    )
    assert "cooperative-sticky" in found["range-piling"]["fix"]
    assert "the range assignor, an eager protocol" in found["eager-protocol"]["text"]
    assert "group.instance.id" in found["eager-protocol"]["fix"], "no static membership"
    assert "drained-and-lagging" not in found, "no member holds a drained and a lagging one"
    assert "idle-consumers" not in found and "rebalancing" not in found


def test_static_members_are_not_told_to_become_static(
    noida: NoidaKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    topic, group = names("static")
    create_topic(noida.bootstrap, topic, 2, RECORDS)
    with live_group(noida.bootstrap, group, topic) as members:
        consumers = [members.join("range", f"{group}-{n}") for n in range(2)]
        held = members.settle(2)
        for consumer, partitions in zip(consumers, held, strict=True):
            members.commit(consumer, dict.fromkeys(partitions, RECORDS))
        body = doctor_json(capsys, noida, group)
    eager = by_kind(body)["eager-protocol"]
    assert "group.instance.id" not in eager["fix"] and "static membership" not in eager["text"]
    assert "rebalances" not in by_kind(body)


def test_a_consumer_holding_a_drained_partition_next_to_a_lagging_one(
    noida: NoidaKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seed 000 in small: round-robin, fewer consumers than partitions, each member drained
    its first partition and lags on the other."""
    topic, group = names("drained")
    create_topic(noida.bootstrap, topic, 4, RECORDS)
    with live_group(noida.bootstrap, group, topic) as members:
        consumers = [members.join("roundrobin") for _ in range(2)]
        held = members.settle(4)
        assert [len(h) for h in held] == [2, 2]
        for consumer, (drained, lagging) in zip(consumers, held, strict=True):
            members.commit(consumer, {drained: RECORDS, lagging: 1})
        body = doctor_json(capsys, noida, group)
    mixed = by_kind(body)["drained-and-lagging"]
    assert mixed["text"].startswith(
        "2 of 2 consumers hold a drained partition next to a lagging one"
    )
    assert "fewer consumers than partitions (2 < 4)" in mixed["text"]


def test_members_leaving_while_the_doctor_watches_are_rebalances(noida: NoidaKafka) -> None:
    topic, group = names("leaving")
    create_topic(noida.bootstrap, topic, 2, RECORDS)
    config = KafkaConfig(noida.bootstrap)
    with live_group(noida.bootstrap, group, topic) as members:
        consumers = [members.join("range") for _ in range(2)]
        held = members.settle(2)
        for consumer, partitions in zip(consumers, held, strict=True):
            members.commit(consumer, dict.fromkeys(partitions, 5))
        naps = itertools.count()

        def sleep_then_one_leaves(seconds: float) -> None:
            if next(naps) == 1:
                members.leave(consumers[1])
            time.sleep(seconds)

        source = KafkaOffsetSource(config, group)
        try:
            exam = examine(group, source, KafkaMembership(config), 2.0, 0.25, sleep_then_one_leaves)
        finally:
            source.close()
    found = {finding.kind: finding for finding in diagnose(exam)}
    assert "the group rebalanced at least" in found["rebalances"].text
    assert exam.memberships is not None
    assert len(exam.memberships[0].members) == 2
    assert len(exam.memberships[-1].members) == 1


def test_a_group_caught_mid_rebalance_is_not_called_idle(noida: NoidaKafka) -> None:
    """Two range members stop polling, a third joins: an eager rebalance waits for the first
    two to give their partitions up, and the broker reports PreparingRebalance with every
    member holding nothing — the moment the doctor once called "3 of 3 consumers idle"."""
    topic, group = names("midway")
    create_topic(noida.bootstrap, topic, 6, RECORDS)
    config = KafkaConfig(noida.bootstrap)
    with live_group(noida.bootstrap, group, topic) as members:
        consumers = [members.join("range") for _ in range(2)]
        held = members.settle(6)
        for consumer, partitions in zip(consumers, held, strict=True):
            members.commit(consumer, dict.fromkeys(partitions, 4))
        members.stop_polling()
        with live_group(noida.bootstrap, group, topic) as newcomer:
            newcomer.join("range")
            newcomer.start_polling()
            membership = KafkaMembership(config)
            wait_for(
                "the rebalance to begin",
                lambda: (d := membership.describe(group)) and len(d.members) == 3,
                timeout_s=10,
            )
            source = KafkaOffsetSource(config, group)
            try:
                exam = examine(group, source, membership, 0.6, 0.2)
            finally:
                source.close()
            members.start_polling()  # the rebalance completes: members close without waiting
    assert exam.memberships is not None
    assert exam.memberships[-1].state == "PREPARING_REBALANCING"
    assert all(not m.partitions for m in exam.memberships[-1].members)
    found = [finding.kind for finding in diagnose(exam)]
    assert "rebalancing" in found and "idle-consumers" not in found
    assert "3 members holding no partition yet" in diagnose(exam)[found.index("rebalancing")].text


def test_a_group_with_members_and_no_commits_is_diagnosed_and_served(
    noida: NoidaKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new group that has not committed yet (seed 003's group stuck in rebalances never
    does): the doctor judges it by the partitions its members hold, and serve shows them."""
    topic, group = names("uncommitted")
    create_topic(noida.bootstrap, topic, 2, RECORDS)
    with live_group(noida.bootstrap, group, topic) as members:
        for _ in range(2):
            members.join("cooperative-sticky")
        members.settle(2)
        body = doctor_json(capsys, noida, group)
        assert "no-commits" in kinds(body["findings"])
        assert (
            "has 2 members but has committed no offset yet" in by_kind(body)["no-commits"]["text"]
        )
        assert body["status"] != "NO_COMMITS"

        with lagless_serve(noida.bootstrap, "--group", group, "--interval", "0.2") as url:
            status = wait_for(
                "the members' partitions",
                lambda: (s := get_json(f"{url}/api/groups/{group}")["status"])["partitions"] and s,
            )
    assert (status["state"], status["members"], status["partition_count"]) == ("STABLE", 2, 2)
    assert status["totallag"] == 2 * RECORDS, "from the log start: nothing committed"
    assert [p["committed"] for p in status["partitions"]] == [None, None]
    assert "no-commits" in kinds(status["findings"])


def test_a_group_without_consumers_is_stop_on_the_page_and_in_the_doctor_at_once(
    noida: NoidaKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    """The group committed, then its only member left: the broker says Empty. serve's window
    is 10 s and the doctor watches 1 s, yet both say STOP from the first samples: nobody holds
    the partitions."""
    topic, group = names("gone")
    create_topic(noida.bootstrap, topic, 2, RECORDS)
    with live_group(noida.bootstrap, group, topic) as members:
        consumer = members.join("cooperative-sticky")
        members.settle(2)
        members.commit(consumer, {0: 3, 1: RECORDS})
    body = doctor_json(capsys, noida, group)
    assert body["status"] == "STOP"
    assert by_kind(body)["stop"]["text"].startswith(
        f"{topic}:0: lag and no member of group {group} holds them (the group has 0 members)"
    )
    with lagless_serve(noida.bootstrap, "--group", group, "--interval", "0.2") as url:
        started = time.monotonic()
        status = wait_for(
            "a first sample",
            lambda: (s := get_json(f"{url}/api/groups/{group}")["status"])["sampled_at"] and s,
        )
        assert time.monotonic() - started < 8, "within serve's 10 s window"
    assert (status["status"], status["state"]) == ("STOP", "EMPTY")
    assert [f["text"] for f in status["findings"] if f["kind"] == "stop"] == [
        by_kind(body)["stop"]["text"]
    ], "the page and the doctor say the same"


def test_serve_without_groups_named_watches_every_group_the_broker_lists(
    noida: NoidaKafka,
) -> None:
    """ListGroups, which the embedded broker does not answer: serve finds the groups itself,
    and their members (with the first look of a few new groups, with the next round when a
    fleet's worth are new, as on this session's noida-db after the fleet tests)."""
    topic, group = names("listed")
    create_topic(noida.bootstrap, topic, 1, RECORDS)
    with live_group(noida.bootstrap, group, topic) as members:
        consumer = members.join("cooperative-sticky")
        members.settle(1)
        members.commit(consumer, {0: 4})
        with lagless_serve(noida.bootstrap, "--interval", "0.2") as url:

            def with_members() -> dict[str, Any] | None:
                groups = {g["group"]: g for g in get_json(url + "/api/groups")["groups"]}
                found = groups.get(group)
                return found if found and found["state"] else None

            listed = wait_for("the group to be listed with its members", with_members)
            assert listed["state"] == "STABLE" and listed["members"] == 1
            status = wait_for(
                "its lag",
                lambda: (s := get_json(f"{url}/api/groups/{group}")["status"])["partitions"] and s,
            )
    assert status["totallag"] == RECORDS - 4


def test_describing_a_group_survives_the_process_that_asks_being_killed(
    noida: NoidaKafka, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """librdkafka aborts its process when a connection drops during DescribeGroups (issue 4605;
    it killed `lagless serve` when the broker came back): the request runs in a child process.
    Here the child is killed at the request (the describe-group failpoint stands for the
    abort): the caller hears "not told" and a warning, and the next request starts a new child
    that answers."""
    topic, group = names("describer")
    create_topic(noida.bootstrap, topic, 2, RECORDS)
    with live_group(noida.bootstrap, group, topic) as members:
        members.join("range")
        members.settle(2)
        membership = KafkaMembership(KafkaConfig(bootstrap=noida.bootstrap))
        try:
            monkeypatch.setenv("LAGLESS_FAILPOINT", "describe-group")
            with caplog.at_level("WARNING", logger="lagless.kafka.group_describer"):
                assert membership.describe(group) is None
            assert "its process ended (exit -9)" in caplog.text

            monkeypatch.delenv("LAGLESS_FAILPOINT")
            described = membership.describe(group)
        finally:
            membership.close()
    assert described is not None
    assert (described.state, len(described.members)) == ("STABLE", 1)
    assert sorted(described.members[0].partitions) == [(topic, 0), (topic, 1)]
