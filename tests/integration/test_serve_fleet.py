"""`lagless serve` watching a fleet of groups on noida-db, as a user starts it (every group the
broker lists): all reported with the lag they have, from one set of clients (file descriptors
and child processes that do not grow with the groups), and no sampling thread lost. The
2,000-group figures are bench/fleet.py's."""

from __future__ import annotations

import threading
import time
import uuid

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from lagless.kafka.config import KafkaConfig
from lagless.lag.offsets import KafkaFleetSource
from lagless.lag.status import Status
from lagless.serve.sampler import Sampler, SamplerSettings
from tests.harness.fleet import make_fleet
from tests.harness.live_group import create_topic
from tests.harness.noida import NoidaKafka
from tests.harness.serve import (
    children,
    descriptors,
    get,
    get_json,
    lagless_serve_process,
    metric,
    parse_metrics,
    wait_for,
)

GROUPS = 300
PARTITIONS = 4
# Before this change each group held its own clients (~13 descriptors: 505 groups held
# 6,567, and select() refused past 1,024). Here one admin client, one offsets consumer, a
# child process's pipes and the HTTP server's sockets, whatever the number of groups.
MOST_DESCRIPTORS = 64


def test_every_listed_group_is_reported_with_its_lag_from_one_set_of_clients(
    noida: NoidaKafka,
) -> None:
    prefix = f"fleet-{uuid.uuid4().hex[:6]}"
    fleet = make_fleet(noida.bootstrap, prefix, GROUPS, PARTITIONS, groups_per_topic=10)
    with lagless_serve_process(noida.bootstrap, "--interval", "0.5") as (url, process):
        started = time.monotonic()

        def all_reported() -> dict[str, dict] | None:
            groups = {g["group"]: g for g in get_json(url + "/api/groups")["groups"]}
            ours = {g: groups.get(g) for g in fleet.groups}
            sampled = all(g is not None and g["sampled_at"] for g in ours.values())
            return ours if sampled else None  # type: ignore[return-value]

        reported = wait_for("every group sampled", all_reported, timeout_s=60)
        print(f"{GROUPS} groups reported {time.monotonic() - started:.1f} s after the start")
        held = descriptors(process.pid)
        helpers = children(process.pid)
        samples = parse_metrics(get(url + "/metrics")[1])
        rounds_before = metric(samples, "kafka_consumergroup_poll_time_ms")
        time.sleep(1.5)  # more rounds: the sampler goes on
        later = get_json(url + "/api/groups")["groups"]

    assert {g: r["totallag"] for g, r in reported.items()} == {
        g: fleet.lag(g) for g in fleet.groups
    }
    assert all(r["error"] is None and r["partition_count"] == PARTITIONS for r in reported.values())
    for group in fleet.groups[:20]:
        assert metric(samples, "kafka_consumergroup_group_sum_lag", group=group) == fleet.lag(group)
    assert rounds_before is not None
    assert held <= MOST_DESCRIPTORS, f"{held} file descriptors for {GROUPS} groups"
    assert len(helpers) == 1, "one child process asks the coordinators for every group"
    assert max(g["sampled_at"] for g in later) > max(r["sampled_at"] for r in reported.values())


def test_a_broker_away_leaves_groups_unknown_with_one_describe_at_a_time() -> None:
    """noida-db stopped under a sampler that reads offsets the batched way (kafka/wire.py) and
    describes the groups in a thread between rounds: every group UNKNOWN with its reason,
    round after round, and no more than one describing thread (each takes the request's
    timeout while the broker is away; the rounds, whose offsets fail at once, used to start
    one each)."""
    server = NoidaKafka.start_new()
    try:
        create_topic(server.bootstrap, "away", 2, 3)
        admin = AdminClient({"bootstrap.servers": server.bootstrap})
        groups = ["away-g1", "away-g2"]
        for group in groups:
            offsets = [TopicPartition("away", p, 1) for p in range(2)]
            admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, offsets)])[
                group
            ].result(30)
        source = KafkaFleetSource(KafkaConfig(server.bootstrap), request_timeout_s=1.0)
        sampler = Sampler(source, SamplerSettings(1.0, 30.0, 100.0), groups)
        try:
            sampler.sample_once()
            assert [v.error for v in sampler.views()] == [None, None]
            server.stop()
            # noida-db's last answers may still arrive just after it was told to stop.
            deadline = time.monotonic() + 10
            while sampler.views()[0].error is None and time.monotonic() < deadline:
                time.sleep(0.2)
                sampler.sample_once()
            describing = []
            for _ in range(3):
                sampler.sample_once()
                describing.append(
                    sum(t.name in ("lag-members", "describe-groups") for t in threading.enumerate())
                )
                views = sampler.views()
                assert [v.status for v in views] == [Status.UNKNOWN] * 2
                assert all(v.error and "FindCoordinator" in v.error for v in views), views
            assert max(describing) <= 1, describing
        finally:
            sampler.close()
    finally:
        server.destroy()
