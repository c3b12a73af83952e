"""The executor side: read exactly the offset ranges of a task with assign, as Arrow batches.

No consumer group is joined and nothing is committed, so a slow or finished range never
blocks another task and never triggers a rebalance (seeds 000, 002, 003).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from lagless.exceptions import DataLossError, TerminalError
from lagless.kafka.config import KafkaConfig
from lagless.partitions import TP
from lagless.planner.ranges import OffsetRange
from lagless.retry import DEFAULT_RETRY_S, away_error, stopped_waiting
from lagless.source.schema import (
    ARROW_SCHEMA,
    HEADER_TYPE,
    NO_TIMESTAMP_TYPE,
    TIMESTAMP_TYPE_BY_KIND,
)

CONSUME_BATCH = 10_000
# Bytes of records in one Arrow batch handed to Spark. With librdkafka's prefetch capped in
# KafkaConfig.reader(), this keeps a task's memory bounded whatever the record size: 10,000
# records of seed 002's 800 KB would otherwise be 8 GB in one batch.
MAX_BATCH_BYTES = 8 * 1024 * 1024
# Records asked for before any record's size is known.
FIRST_CONSUME = 16
# A task that gets no record logs it this often at least (the broker may be away).
WARN_EVERY_S = 10.0

Headers = list[tuple[str, bytes]]
log = logging.getLogger(__name__)

# A task reads its ranges at once, with one consumer assigned every partition it reads: one
# fetch brings records of all of them, where reading the ranges in turn paid a fetch's round
# trip per range and per response (the embedded broker returns one produced batch per
# partition per fetch: 16 ranges of one-record batches read 2.9x faster on one consumer). At most
# LANES partitions are assigned at a time, each prefetching up to LANE_QUEUE_KBYTES, so a
# task's memory stays bounded whatever its ranges and record sizes.
LANES = 16
LANE_QUEUE_KBYTES = 2 * 1024
# Bytes of a topic's records a task hands on at once (gathered).
GATHER_BYTES = 4 * 1024 * 1024
# How long a task asks for a new topic's metadata before it reads without it (_Pooled).
METADATA_WAIT_S = 2.0

# Idle consumers per configuration in this process. Spark reuses its Python workers between
# tasks, so a task borrows the consumer (and its broker connections) that the last task left,
# as Spark's own Kafka source keeps a consumer pool per executor: one, as a process runs one
# task at a time.
_idle: dict[tuple[tuple[str, str], ...], _Pooled] = {}


class _Pooled:
    """A reader consumer and the topics it has metadata of: assigned a topic it does not know,
    librdkafka waited ~1 s for its next metadata refresh before fetching (measured on the
    embedded broker), so a task asks for a new topic's metadata first."""

    def __init__(self, settings: dict[str, object]) -> None:
        self.consumer = Consumer(settings)
        self.topics: set[str] = set()

    def know(self, topics: set[str]) -> None:
        for topic in sorted(topics - self.topics):
            try:
                self.consumer.list_topics(topic, timeout=METADATA_WAIT_S)
            except KafkaException:
                return  # a broker away: the read waits for it within its retry budget
            self.topics.add(topic)


@contextmanager
def pooled_consumer(config: KafkaConfig, topics: set[str]) -> Iterator[Consumer]:
    """A reader consumer with nothing assigned that knows `topics`; returned to the pool unless
    the task failed (or stopped half way: what it prefetched must not reach the next task)."""
    settings = {**config.reader(), "queued.max.messages.kbytes": LANE_QUEUE_KBYTES}
    key = tuple(sorted((k, str(v)) for k, v in settings.items()))
    pooled = _idle.pop(key, None) or _Pooled(settings)
    try:
        pooled.know(topics)
        yield pooled.consumer
    except BaseException:
        pooled.consumer.close()
        raise
    pooled.consumer.unassign()
    replaced = _idle.pop(key, None)
    if replaced is not None:
        replaced.consumer.close()
    _idle[key] = pooled


@atexit.register
def _close_idle() -> None:
    while _idle:
        _idle.popitem()[1].consumer.close()


def read_ranges(
    config: KafkaConfig,
    pieces: Sequence[OffsetRange],
    *,
    fail_on_data_loss: bool = True,
    poll_timeout_s: float = 60.0,
    retry_s: float = DEFAULT_RETRY_S,
    stop: threading.Event | None = None,
) -> Iterator[pa.RecordBatch]:
    """Read the pieces at once (LANES partitions at a time), a piece's records in offset order,
    each batch of one piece; pieces of one partition are read in their order. A task that gets
    no record for poll_timeout_s (at most WARN_EVERY_S) logs a broker away, and waits up to
    retry_s (librdkafka reconnects by itself): then a TransientError; or until `stop` is set:
    then Stopped (the batch fails whole, and is replayed by a rerun)."""
    pieces = [piece for piece in pieces if piece.start < piece.end]
    if not pieces:
        return
    patience = _Patience(config.bootstrap, min(poll_timeout_s, WARN_EVERY_S), retry_s, stop)
    with pooled_consumer(config, {piece.topic for piece in pieces}) as consumer:
        lanes = _Lanes(consumer, pieces, fail_on_data_loss)
        per_call = FIRST_CONSUME
        while lanes.reading:
            messages = consumer.consume(min(per_call, lanes.left()), timeout=1.0)
            batches = lanes.take(messages)
            for batch in batches:
                record_bytes = max(1, batch.nbytes // batch.num_rows)
                per_call = max(1, min(CONSUME_BATCH, MAX_BATCH_BYTES // record_bytes))
                yield batch
            if batches:
                patience.progressed()
            elif lanes.reading:
                patience.check(*lanes.first_reading())


def gathered(
    batches: Iterable[pa.RecordBatch], limit: int = GATHER_BYTES
) -> Iterator[pa.RecordBatch]:
    """read_ranges' batches gathered per topic into batches of about `limit` bytes. A batch
    of read_ranges is a partition's records of one fetch: a few records when producers send
    small batches, and what follows has a fixed cost per batch (decoding Debezium events, one
    task, bench-shaped: ~490 µs an event three at a time, ~3 µs 5,000 at a time)."""
    pending: dict[str, list[pa.RecordBatch]] = {}
    sizes: dict[str, int] = {}
    for batch in batches:
        if not batch.num_rows:
            continue
        topic = batch.column("topic")[0].as_py()
        pending.setdefault(topic, []).append(batch)
        # Its buffers' size (a slice's whole buffers): `nbytes` took ~10 µs a call.
        sizes[topic] = sizes.get(topic, 0) + batch.get_total_buffer_size()
        if sizes[topic] >= limit:
            yield pa.concat_batches(pending.pop(topic))
            del sizes[topic]
    for group in pending.values():
        yield pa.concat_batches(group)


class _Lane:
    """A partition's pieces, read in their order, and the offset the current one is at."""

    def __init__(self, pieces: list[OffsetRange]) -> None:
        self.pieces = pieces
        self.position = pieces[0].start

    @property
    def piece(self) -> OffsetRange:
        return self.pieces[0]

    def next_piece(self) -> bool:
        """On to the partition's next piece; False when there is none. The consumer must seek
        when the next piece does not start where this one ended."""
        self.pieces.pop(0)
        if not self.pieces:
            return False
        self.position = self.piece.start
        return True


class _Lanes:
    """The partitions a task reads, LANES of them assigned to its consumer at a time."""

    def __init__(self, consumer: Consumer, pieces: list[OffsetRange], fail_on_data_loss: bool):
        self.consumer = consumer
        self.fail_on_data_loss = fail_on_data_loss
        by_partition: dict[TP, list[OffsetRange]] = {}
        for piece in pieces:
            by_partition.setdefault(piece.key, []).append(piece)
        self.waiting = [_Lane(partition_pieces) for partition_pieces in by_partition.values()]
        self.reading: dict[TP, _Lane] = {}
        self._assign_waiting()

    def left(self) -> int:
        """Records the assigned pieces still hold at most."""
        return sum(lane.piece.end - lane.position for lane in self.reading.values())

    def first_reading(self) -> tuple[OffsetRange, int]:
        """The piece a task waiting for records names, and where it is."""
        lane = next(iter(self.reading.values()))
        return lane.piece, lane.position

    def take(self, messages: list[Message]) -> list[pa.RecordBatch]:
        """The records of `messages` in the assigned pieces, as a batch per piece; the lanes
        moved on by them, and by the end-of-log and offset errors among them."""
        by_partition: dict[Any, list[Message]] = {}
        for message in messages:
            by_partition.setdefault((message.topic(), message.partition()), []).append(message)
        for tp in [tp for tp in by_partition if tp[1] is None or tp[1] < 0]:
            for message in by_partition.pop(tp):  # the client's errors, of no partition
                if message.error() is not None:
                    _client_error(message)
        batches: list[pa.RecordBatch] = []
        for tp, mine in by_partition.items():
            lane = self.reading.get(tp)
            if lane is not None:  # else fetched before its lane ended, or before this task
                self._take_lane(lane, mine, batches)
        return batches

    def _take_lane(self, lane: _Lane, messages: list[Message], out: list[pa.RecordBatch]) -> None:
        while True:
            piece = lane.piece
            batch, events = _decode(messages, piece, lane.position)
            if batch is not None:
                lane.position = batch.column("offset")[-1].as_py() + 1
                out.append(batch)
            last = next((m for m in reversed(messages) if m.error() is None), None)
            if last is not None and _offset(last) >= piece.end:
                # The range's last offsets carried no record (transaction markers, aborts).
                lane.position = piece.end
            for event in events:
                lane.position = max(lane.position, self._after_event(event, lane))
            if lane.position < piece.end:
                return
            ended = piece.end
            if not lane.next_piece():
                self._finish(piece.key)
                return
            if lane.position != ended:
                self._seek(lane)
                return
            # The next piece goes on where this one ended: these messages may hold its records.

    def _after_event(self, event: Message, lane: _Lane) -> int:
        """The read position an end-of-log or offset error implies."""
        piece = lane.piece
        err = cast(KafkaError, event.error())
        where = f"{piece.topic}[{piece.partition}]"
        if err.code() == KafkaError._PARTITION_EOF:
            end_of_log = _offset(event)
            if end_of_log >= piece.end:
                # Offsets below the end of the log that carried no record (transaction markers,
                # compaction) are absent, not lost.
                return piece.end
            what = f"the log now ends at {end_of_log}"
            return _lost(where, what, self.fail_on_data_loss, piece.end)
        if err.code() in _OFFSET_GONE:
            tp = TopicPartition(piece.topic, piece.partition)
            low, _ = self.consumer.get_watermark_offsets(tp, timeout=10)
            resume = min(max(low, piece.start), piece.end)
            _lost(where, f"offsets before {low} were deleted", self.fail_on_data_loss, resume)
            if resume < piece.end:
                lane.position = resume
                self._seek(lane)
            return resume
        if err.fatal():
            raise TerminalError(f"reading {where}: {err.str()}")
        return 0

    def _seek(self, lane: _Lane) -> None:
        """The lane's partition fetched again from its position (librdkafka drops what it
        fetched before)."""
        piece = lane.piece
        self.consumer.incremental_unassign([TopicPartition(piece.topic, piece.partition)])
        self.consumer.incremental_assign(
            [TopicPartition(piece.topic, piece.partition, lane.position)]
        )

    def _finish(self, tp: TP) -> None:
        del self.reading[tp]
        self.consumer.incremental_unassign([TopicPartition(*tp)])
        self._assign_waiting()

    def _assign_waiting(self) -> None:
        added = []
        while self.waiting and len(self.reading) < LANES:
            lane = self.waiting.pop(0)
            self.reading[lane.piece.key] = lane
            added.append(TopicPartition(lane.piece.topic, lane.piece.partition, lane.position))
        if added:
            self.consumer.incremental_assign(added)


def _client_error(event: Message) -> None:
    """An error of the client's, of no partition: fatal ones end the task; others librdkafka
    recovers from by itself (a broker away is the patience's to judge)."""
    err = cast(KafkaError, event.error())
    if err.fatal():
        raise TerminalError(f"reading from Kafka: {err.str()}")


class _Patience:
    """How long a task waits for a record: it logs a broker away every `warn_every_s`, and
    gives up when the retry budget is spent."""

    def __init__(
        self,
        bootstrap: str,
        warn_every_s: float,
        budget_s: float,
        stop: threading.Event | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.warn_every_s = warn_every_s
        self.budget_s = budget_s
        self.stop = stop
        self._progress_at = time.monotonic()
        self._warned = 0

    def progressed(self) -> None:
        if self._warned:
            log.info(
                "the broker at %s is back after %.0f s",
                self.bootstrap,
                time.monotonic() - self._progress_at,
            )
        self._progress_at = time.monotonic()
        self._warned = 0

    def check(self, piece: OffsetRange, position: int) -> None:
        waited = time.monotonic() - self._progress_at
        where = f"{piece.topic}[{piece.partition}] at offset {position} (range ends at {piece.end})"
        if self.stop is not None and self.stop.is_set():
            raise stopped_waiting(f"reading {where}")
        if waited > self.budget_s:
            log.error("no record from %s for %.0f s: giving up", where, waited)
            raise away_error(
                f"the broker at {self.bootstrap}",
                waited,
                self.budget_s,
                f"no record from {where}",
            )
        if waited > self.warn_every_s * (self._warned + 1):
            self._warned += 1
            log.warning(
                "no record from %s for %.0f s: the broker may be away; waiting up to %.0f s",
                where,
                waited,
                self.budget_s,
            )


# librdkafka reports a fetch below the log start as OFFSET_OUT_OF_RANGE, or, under
# auto.offset.reset=error (the reader's setting), as _AUTO_OFFSET_RESET.
_OFFSET_GONE = (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET)


def _lost(where: str, what: str, fail_on_data_loss: bool, resume_at: int) -> int:
    if fail_on_data_loss:
        raise DataLossError(
            f"{where}: {what} before lagless read them; "
            "rerun with failOnDataLoss=false to skip what is gone"
        )
    log.warning(
        "%s: %s before lagless read them; skipped up to %d (failOnDataLoss=false)",
        where,
        what,
        resume_at,
    )
    return resume_at


def _offset(message: Message) -> int:
    return cast(int, message.offset())


def _decode(
    messages: list[Message], piece: OffsetRange, position: int
) -> tuple[pa.RecordBatch | None, list[Message]]:
    """The records of one partition's `messages` from position to the range's end as one
    Arrow batch, and the error events beside them.

    A pass per field over the messages: this is lagless's per-record cost (comprehensions,
    ~2x faster than one loop appending to each list).
    """
    end = piece.end
    records = [m for m in messages if m.error() is None]
    events = [m for m in messages if m.error() is not None] if len(records) < len(messages) else []
    offsets = cast(list[int], [m.offset() for m in records])
    if offsets and not (position <= min(offsets) and max(offsets) < end):
        inside = [i for i, offset in enumerate(offsets) if position <= offset < end]
        records = [records[i] for i in inside]
        offsets = [offsets[i] for i in inside]
    count = len(offsets)
    if not count:
        return None, events
    keys = [m.key() for m in records]
    values = [m.value() for m in records]
    stamps = [m.timestamp() for m in records]
    kinds = [TIMESTAMP_TYPE_BY_KIND.get(kind, NO_TIMESTAMP_TYPE) for kind, _ in stamps]
    millis = [ms for _, ms in stamps]
    with_headers = any(m.headers() is not None for m in records)
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.repeat(pa.scalar(piece.topic, pa.string()), count),
            pa.repeat(pa.scalar(piece.partition, pa.int32()), count),
            pa.array(offsets, pa.int64()),
            _timestamps(millis, piece, offsets),
            pa.array(kinds, pa.int32()),
            _headers(records) if with_headers else pa.nulls(count, HEADER_TYPE),
        ],
        schema=ARROW_SCHEMA,
    )
    return batch, events


def _timestamps(millis: list[int], piece: OffsetRange, offsets: list[int]) -> pa.Array:
    """Milliseconds since the epoch as Spark's microsecond timestamps; a record whose timestamp
    overflows that (a producer that wrote nanoseconds) fails the task naming it, as Spark's
    KAFKA_MALFORMED_RECORD_TIMESTAMP does, rather than wrapping around to a wrong time."""
    try:
        micros = pc.multiply_checked(pa.array(millis, pa.int64()), 1000)
    except pa.ArrowInvalid:
        bad = next(i for i, ms in enumerate(millis) if abs(ms) > (2**63 - 1) // 1000)
        raise TerminalError(
            f"{piece.topic}[{piece.partition}] offset {offsets[bad]}: the record's timestamp "
            f"{millis[bad]} is not milliseconds since the epoch (too large for a timestamp)"
        ) from None
    return micros.cast(pa.timestamp("us", tz="UTC"))


def _headers(records: list[Message]) -> pa.Array:
    """The records' headers (null where a record has none), built from flat lists of keys and
    values: 8 times faster than a dict per header (Debezium's records carry 4 or 5 headers,
    ~10 µs a record that way)."""
    keys: list[str] = []
    values: list[bytes | None] = []
    ends = [0]
    for record in records:
        found = cast(Headers | None, record.headers())
        for key, value in found or ():
            keys.append(key)
            values.append(value)
        ends.append(len(keys) if found else -1)
    offsets = np.array(ends, np.int64)
    missing = offsets < 0
    offsets = np.maximum.accumulate(np.where(missing, 0, offsets))
    items = pa.StructArray.from_arrays(
        [pa.array(keys, pa.string()), pa.array(values, pa.binary())],
        fields=list(HEADER_TYPE.value_type),
    )
    return pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()), items, type=HEADER_TYPE, mask=pa.array(missing[1:])
    )
