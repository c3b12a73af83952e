"""The reader's per-record pass (source/reader.py `_decode`, `_Lanes.take`): whatever a fetch
returns (records out of the piece, errors among them, headers or none), the batch holds
exactly the piece's records from the read position, in the order fetched, and the errors come
back beside it. Messages are built in Python (confluent_kafka.Message), no broker."""

from __future__ import annotations

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, Message
from hypothesis import given, settings
from hypothesis import strategies as st

from lagless.exceptions import TerminalError
from lagless.planner.ranges import OffsetRange
from lagless.source.reader import _decode, _Lanes, gathered
from lagless.source.schema import ARROW_SCHEMA

TOPIC = "t"


@st.composite
def fetches(draw: st.DrawFn) -> tuple[list[Message], int, int]:
    count = draw(st.integers(0, 30))
    offsets = draw(st.lists(st.integers(0, 60), min_size=count, max_size=count))
    messages = []
    for offset in offsets:
        if draw(st.integers(0, 9)) == 0:
            error = KafkaError(KafkaError._PARTITION_EOF)
            messages.append(Message(topic=TOPIC, partition=0, offset=offset, error=error))
            continue
        headers = [("h", b"%d" % offset)] if draw(st.booleans()) else None
        key = draw(st.none() | st.binary(max_size=4))
        value = draw(st.none() | st.binary(max_size=8))
        stamp = (draw(st.sampled_from([0, 1, 2])), draw(st.integers(0, 2**40)))
        messages.append(
            Message(
                topic=TOPIC,
                partition=0,
                offset=offset,
                key=key,
                value=value,
                headers=headers,
                timestamp=stamp,
            )
        )
    start = draw(st.integers(0, 40))
    return messages, start, draw(st.integers(start, 70))


@settings(max_examples=300, deadline=None)
@given(fetches())
def test_a_batch_holds_the_piece_records_from_the_position_in_fetch_order(fetch):
    messages, position, end = fetch
    piece = OffsetRange(TOPIC, 0, 0, end)
    batch, events = _decode(messages, piece, position)
    wanted = [m for m in messages if m.error() is None and position <= (m.offset() or 0) < end]
    assert events == [m for m in messages if m.error() is not None]
    if not wanted:
        assert batch is None
        return
    assert batch is not None
    rows = batch.to_pylist()
    assert [r["offset"] for r in rows] == [m.offset() for m in wanted]
    assert [r["key"] for r in rows] == [m.key() for m in wanted]
    assert [r["value"] for r in rows] == [m.value() for m in wanted]
    assert [r["timestamp"].timestamp() * 1000 for r in rows] == [
        pytest.approx(m.timestamp()[1]) for m in wanted
    ]
    with_headers = any(m.headers() for m in wanted)
    assert [r["headers"] is not None for r in rows] == [
        with_headers and m.headers() is not None for m in wanted
    ]
    assert batch.column("topic").unique().to_pylist() == [TOPIC]
    assert pa.types.is_int32(batch.schema.field("partition").type)


class _Unassigned:
    """The consumer a task's lanes assign partitions to: only what take() calls."""

    def incremental_assign(self, partitions: object) -> None:
        pass

    def incremental_unassign(self, partitions: object) -> None:
        pass


def test_a_fatal_client_error_of_no_partition_ends_the_task_and_others_are_passed_over():
    lanes = _Lanes(_Unassigned(), [OffsetRange(TOPIC, 0, 0, 2)], fail_on_data_loss=True)  # type: ignore[arg-type]
    transport = KafkaError(KafkaError._TRANSPORT)
    record = Message(topic=TOPIC, partition=0, offset=0, value=b"a")
    batches = lanes.take([Message(error=transport, partition=-1), record])
    assert [b.num_rows for b in batches] == [1]
    fatal = KafkaError(KafkaError._FATAL, fatal=True)
    with pytest.raises(TerminalError, match="reading from Kafka"):
        lanes.take([Message(error=fatal)])


def _records(topic: str, start: int, count: int) -> pa.RecordBatch:
    if not count:
        return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
    messages = [
        Message(topic=topic, partition=start % 3, offset=start + i, value=b"v" * 40)
        for i in range(count)
    ]
    batch, _ = _decode(messages, OffsetRange(topic, start % 3, 0, start + count), start)
    assert batch is not None
    return batch


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 5)), max_size=30), st.integers(1, 2000)
)
def test_gathered_batches_hold_each_topics_records_in_order_one_topic_each(drawn, limit):
    """A fetch's few records per partition are gathered per topic (the decoding after it has a
    fixed cost per batch): nothing lost, doubled or reordered within a topic; a batch grows
    past `limit` by one read batch at most."""
    batches = [_records(topic, 10 * n, size) for n, (topic, size) in enumerate(drawn)]
    out = list(gathered(iter(batches), limit))
    for topic in "ab":
        read = [b for b in batches if b.num_rows and b.column("topic")[0].as_py() == topic]
        mine = [b for b in out if b.column("topic")[0].as_py() == topic]
        assert all(b.column("topic").unique().to_pylist() == [topic] for b in mine)
        offsets = [o for b in mine for o in b.column("offset").to_pylist()]
        assert offsets == [o for b in read for o in b.column("offset").to_pylist()]
        largest = max((b.get_total_buffer_size() for b in read), default=0)
        assert all(b.get_total_buffer_size() < limit + largest + 1024 for b in mine)
    assert all(b.num_rows for b in out)


def test_small_batches_of_a_topic_become_one_under_the_limit():
    batches = [_records(topic, 10 * n, 3) for n, topic in enumerate("abab" * 5)]
    assert [b.num_rows for b in gathered(iter(batches))] == [30, 30]
    assert len(list(gathered(iter(batches), limit=1))) == 20
