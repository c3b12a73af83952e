"""Bytes per record read while Spark starts (lagless import), handed to the source so the first
batch's planning does not read them again: on a broker slow to answer a fetch at a new offset
(Tansu: ~3 s for 24 partitions) that read held up the first batch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lagless.gen import explicit, produce_profile
from lagless.kafka.records import Records
from lagless.planner.ranges import OffsetRange
from lagless.source import datasource
from lagless.source.options import SourceOptions
from lagless.source.sampling import sample_meanwhile


def test_sizes_are_sampled_where_records_remain(broker, kafka, topic_name) -> None:
    broker.create_topic(topic_name, 3)
    produce_profile(kafka, topic_name, explicit([300, 0, 40], record_bytes=200), keys=10)
    ends = {(topic_name, 0): 300, (topic_name, 1): 0, (topic_name, 2): 40}

    sizes = sample_meanwhile(Records(kafka), {tp: 0 for tp in ends} | {(topic_name, 2): 40}, ends)()

    # Partition 1 is empty and partition 2 is read to its end: neither is asked for (a fetch
    # where no record comes waits for the sample's timeout).
    assert set(sizes) == {(topic_name, 0)}
    assert 200 <= sizes[topic_name, 0] <= 200 + 16  # the value and a short key


def test_the_planner_samples_only_partitions_whose_size_it_was_not_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[list[OffsetRange]] = []

    def sample(records: object, ranges: list[OffsetRange]) -> dict[tuple[str, int], float]:
        asked.append(list(ranges))
        return {r.key: 50.0 for r in ranges}

    monkeypatch.setattr(datasource, "sample_bytes_per_record", sample)
    options = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": "127.0.0.1:9",
            "subscribe": "t",
            "bytesPerRecord": '{"t": {"0": 104, "1": 800000}}',
        }
    )
    planning = datasource._Planning(options)
    # The broker is never asked: sampling is patched.
    planning._reader = SimpleNamespace(records=None)  # type: ignore[assignment]
    ranges = [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 5, 9), OffsetRange("t", 2, 0, 3)]

    assert planning.bytes_per_record(ranges) == {("t", 0): 104, ("t", 1): 800000, ("t", 2): 50}
    assert asked == [[OffsetRange("t", 2, 0, 3)]]


def test_large_records_are_sampled_whole(broker, kafka, topic_name) -> None:
    """Sampling asks for 4 KiB per partition, so that one fetch brings every partition's few
    records: a record far larger still arrives whole."""
    broker.create_topic(topic_name, 1)
    produce_profile(kafka, topic_name, explicit([20], record_bytes=400_000), compression="zstd")

    sizes = sample_meanwhile(Records(kafka), {(topic_name, 0): 0}, {(topic_name, 0): 20})()

    assert 400_000 <= sizes[topic_name, 0] <= 400_016
