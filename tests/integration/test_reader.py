"""The executor's reader on the embedded broker: exact ranges, a pooled consumer reused across
tasks and partitions, Arrow batches bounded in bytes whatever the record size, and a broker
away waited for within the retry budget."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from lagless.exceptions import TransientError
from lagless.gen import explicit, produce_profile
from lagless.planner.ranges import OffsetRange
from lagless.source import reader
from lagless.source.reader import MAX_BATCH_BYTES, read_ranges


def _offsets(batches: list[pa.RecordBatch]) -> list[tuple[int, int]]:
    table = pa.Table.from_batches(batches)
    return list(zip(table["partition"].to_pylist(), table["offset"].to_pylist(), strict=True))


def test_one_task_reads_its_pieces_and_nothing_else(broker, kafka, topic_name):
    broker.create_topic(topic_name, 3)
    produce_profile(kafka, topic_name, explicit([500, 500, 500]), keys=10)
    # The partitions are read at once, a partition's pieces in their order: pieces of one
    # partition next to each other (one going on where the last ended), and one already read.
    pieces = [
        OffsetRange(topic_name, 2, 100, 130),
        OffsetRange(topic_name, 0, 0, 10),
        OffsetRange(topic_name, 2, 400, 405),
        OffsetRange(topic_name, 2, 405, 450),
        OffsetRange(topic_name, 1, 499, 500),
        OffsetRange(topic_name, 2, 100, 102),
    ]

    batches = list(read_ranges(kafka, pieces))

    for partition in range(3):
        mine = [o for p, o in _offsets(batches) if p == partition]
        planned = [p for p in pieces if p.partition == partition]
        assert mine == [o for p in planned for o in range(p.start, p.end)]
    assert all(len(set(b.column("partition").to_pylist())) == 1 for b in batches)


def test_a_task_reads_more_partitions_than_it_assigns_at_once(broker, kafka, topic_name):
    broker.create_topic(topic_name, reader.LANES + 3)
    produce_profile(kafka, topic_name, explicit([40] * (reader.LANES + 3)), keys=10)
    pieces = [OffsetRange(topic_name, p, 5, 40) for p in range(reader.LANES + 3)]

    got = sorted(_offsets(list(read_ranges(kafka, pieces))))

    assert got == [(p, o) for p in range(reader.LANES + 3) for o in range(5, 40)]


def test_the_consumer_is_reused_by_the_next_task_without_stale_records(broker, kafka, topic_name):
    broker.create_topic(topic_name, 2)
    produce_profile(kafka, topic_name, explicit([2000, 2000]), keys=10)
    reader._close_idle()

    # The first task stops half way (as when Spark cancels it): its consumer has prefetched
    # records of partition 0 that the next task must never see.
    first = read_ranges(kafka, [OffsetRange(topic_name, 0, 0, 2000)])
    next(first)
    first.close()
    list(read_ranges(kafka, [OffsetRange(topic_name, 0, 0, 10), OffsetRange(topic_name, 1, 0, 5)]))
    pooled = next(iter(reader._idle.values())).consumer
    got = _offsets(
        list(
            read_ranges(
                kafka,
                [OffsetRange(topic_name, 1, 1500, 1600), OffsetRange(topic_name, 0, 5, 20)],
            )
        )
    )

    assert sorted(got) == [(0, o) for o in range(5, 20)] + [(1, o) for o in range(1500, 1600)]
    assert next(iter(reader._idle.values())).consumer is pooled


def test_batches_stay_within_the_byte_cap_for_large_records(broker, kafka, topic_name):
    broker.create_topic(topic_name, 1)
    produce_profile(kafka, topic_name, explicit([40], record_bytes=400_000), compression="zstd")

    batches = list(read_ranges(kafka, [OffsetRange(topic_name, 0, 0, 40)]))

    assert sum(b.num_rows for b in batches) == 40
    assert len(batches) > 1
    # Sized by the size of the records before, one record at the least.
    assert all(b.nbytes <= MAX_BATCH_BYTES + 400_100 for b in batches)


def test_a_task_waits_for_a_broker_away_within_the_budget_and_gives_up_past_it(
    broker, kafka, topic_name
):
    broker.create_topic(topic_name, 1)
    produce_profile(kafka, topic_name, explicit([500]))
    piece = OffsetRange(topic_name, 0, 0, 500)
    reader._close_idle()  # a new consumer, which knows no topic yet: it asks the broker away
    broker.set_down()
    back = threading.Timer(4.0, broker.set_up)
    back.start()
    started = time.monotonic()
    try:
        got = _offsets(list(read_ranges(kafka, [piece], retry_s=60)))
    finally:
        back.cancel()
    assert got == [(0, offset) for offset in range(500)]
    assert time.monotonic() - started > 3.5  # it did wait for the broker

    reader._close_idle()
    broker.set_down()
    with pytest.raises(TransientError) as away:
        list(read_ranges(kafka, [piece], retry_s=2))
    assert str(away.value).startswith(f"the broker at {kafka.bootstrap} was away for ")
    assert "past the retry budget of 2 s" in str(away.value)
    assert f"no record from {topic_name}[0] at offset 0" in str(away.value)
