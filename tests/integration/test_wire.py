"""The batched OffsetFetch (kafka/wire.py) against both brokers: on noida-db it tells
what librdkafka's ListConsumerGroupOffsets tells, group by group, in one request for all; the
embedded broker (OffsetFetch up to v6) is left to librdkafka; an unreachable broker is each
group's reason, never an exception."""

from __future__ import annotations

import socket
import uuid

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from lagless.broker import EmbeddedBroker
from lagless.kafka.config import KafkaConfig
from lagless.kafka.group_describer import GroupDescriber
from lagless.kafka.group_offsets import COMMITTED_BY_LAGLESS
from lagless.kafka.offset_reader import OffsetReader
from lagless.kafka.wire import WireClient
from tests.harness.live_group import create_topic
from tests.harness.noida import NoidaKafka


def test_noida_tells_the_same_offsets_as_librdkafka_in_one_request(noida: NoidaKafka) -> None:
    tag = uuid.uuid4().hex[:6]
    topics = [f"fetch-{tag}-{n}" for n in range(3)]
    for topic in topics:
        create_topic(noida.bootstrap, topic, 3, 5)
    admin = AdminClient({"bootstrap.servers": noida.bootstrap})
    groups = [f"fetch-{tag}-g{n}" for n in range(30)]
    for n, group in enumerate(groups):
        offsets = [TopicPartition(topics[n % 3], p, (n + p) % 6) for p in range(3)]
        if n % 5 == 0:  # a second topic
            offsets.append(TopicPartition(topics[(n + 1) % 3], 0, 2))
        admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, offsets)])[
            group
        ].result(30)
    imported = f"fetch-{tag}-import"
    with OffsetReader(KafkaConfig(noida.bootstrap)) as reader:
        reader.groups.commit(imported, {(topics[0], 0): 3, (topics[0], 1): 4})
    nobody = f"fetch-{tag}-nobody"
    everyone = [*groups, imported, nobody]

    fetcher = WireClient(noida.bootstrap, timeout_s=10)
    describer = GroupDescriber({"bootstrap.servers": noida.bootstrap})
    try:
        assert fetcher.usable()
        whole = fetcher.fetch(dict.fromkeys(everyone))
        theirs = describer.ask(everyone, 10, describe=False, offsets=True)
        # Named: only the partitions asked, the others not told.
        named = fetcher.fetch({group: [(topics[n % 3], 1)] for n, group in enumerate(groups)})
    finally:
        fetcher.close()
        describer.close()
    assert {g: sorted((*tp, o) for tp, o in told[0].items()) for g, told in whole.items()} == {
        g: sorted(told) for g, told in theirs.offsets.items()
    }
    assert whole[nobody] == ({}, set())
    assert whole[imported][1] == {COMMITTED_BY_LAGLESS} == {theirs.metadata[imported]}
    assert all(whole[g][1] == {""} for g in groups)
    assert named == {g: ({(topics[n % 3], 1): (n + 1) % 6}, {""}) for n, g in enumerate(groups)}


def test_the_embedded_broker_is_left_to_librdkafka(broker: EmbeddedBroker) -> None:
    fetcher = WireClient(broker.bootstrap, timeout_s=5)
    try:
        assert not fetcher.usable(), "it answers OffsetFetch up to v6"
    finally:
        fetcher.close()


def test_an_unreachable_broker_is_each_groups_reason() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    fetcher = WireClient(f"127.0.0.1:{port}", timeout_s=2)
    found = fetcher.fetch({"a": None, "b": [("t", 0)]})
    assert set(found) == {"a", "b"}
    assert all(isinstance(why, str) and "FindCoordinator" in why for why in found.values())
