"""Produce a profile's records to an existing topic, and say exactly what was written.

Keys follow Kafka's rule that one key lives in one partition: partition p draws its keys from
its own min(keys, records of p) distinct keys `k-<p*keys + j>`. A value is a JSON object such as
`{"key": "k-17", "seq": 12, "partition": 0, "pad": "xxx"}` where `seq` counts the records of
that key, so the newest value of a key is the one with the highest seq (and offset).

A share of records can be poison, cycling through the kinds of RecordKind after GOOD.

Other records (keys, their order, values, tombstones) come from a RecordShape, such as the
deals profile's (gen/deals.py).
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar, Protocol

from confluent_kafka import KafkaError, Message, Producer

from lagless.exceptions import BadInput, TerminalError
from lagless.gen.profiles import Profile
from lagless.kafka.cluster_info import ClusterInfo
from lagless.kafka.config import KafkaConfig
from lagless.kafka.log_offsets import LogOffsets
from lagless.kafka.offset_reader import OffsetReader
from lagless.kafka.produce import produce

FLUSH_TIMEOUT_S = 120.0
POLL_EVERY = 5_000
_INVALID_UTF8_PREFIX = b"\xff\xfe\xfd"

# librdkafka logs every failed connection attempt; the caller reports unreachability in one
# line instead, and whoever configures logging can still see these.
_librdkafka_log = logging.getLogger("lagless.gen.librdkafka")
_librdkafka_log.addHandler(logging.NullHandler())


class RecordKind(StrEnum):
    GOOD = "good"
    INVALID_UTF8 = "invalid-utf8"
    INVALID_JSON = "invalid-json"
    NULL_KEY = "null-key"
    TOMBSTONE = "tombstone"  # a null value: the key deleted


POISON_KINDS = (RecordKind.INVALID_UTF8, RecordKind.INVALID_JSON, RecordKind.NULL_KEY)


@dataclass(frozen=True)
class NewestRecord:
    partition: int
    offset: int
    value: bytes


@dataclass
class ProducedSummary:
    """What `produce_profile` wrote: per partition the offsets [start, end) and record kinds."""

    topic: str
    keys_per_partition: int
    offsets: dict[int, tuple[int, int]]
    kinds: Counter[RecordKind]
    value_bytes: int
    seconds: float
    # Low watermark after producing: above `start` means the broker already dropped records.
    retained_from: dict[int, int]
    poison: list[tuple[int, int, RecordKind]]
    # Per partition, per key: the index of its last GOOD record or tombstone, and its value.
    _newest: dict[int, dict[str, tuple[int, bytes | None]]] = field(repr=False)

    @property
    def records(self) -> int:
        return sum(end - start for start, end in self.offsets.values())

    @property
    def partitions_written(self) -> int:
        return sum(1 for start, end in self.offsets.values() if end > start)

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def truncated_partitions(self) -> list[int]:
        return [p for p, (start, _) in self.offsets.items() if self.retained_from[p] > start]

    def newest_by_key(self) -> dict[str, NewestRecord]:
        """For each key, its last GOOD record, unless a tombstone came after it: what an upsert
        of the topic must end up with."""
        newest: dict[str, NewestRecord] = {}
        for partition, by_key in self._newest.items():
            start = self.offsets[partition][0]
            for key, (index, value) in by_key.items():
                if value is not None:
                    newest[key] = NewestRecord(partition, start + index, value)
        return newest

    def deleted_keys(self) -> set[str]:
        """The keys whose last record is a tombstone: absent after an upsert of the topic."""
        return {
            key
            for by_key in self._newest.values()
            for key, (_, value) in by_key.items()
            if value is None
        }


def poison_positions(total: int, share: float) -> dict[int, RecordKind]:
    """Exactly round(total*share) poison records, evenly spread, kinds in turn."""
    if not 0.0 <= share <= 1.0:
        raise BadInput(f"--poison {share} is not between 0 and 1")
    count = round(total * share)
    return {k * total // count: POISON_KINDS[k % 3] for k in range(count)} if count else {}


class DeliveryErrors:
    """Collects failed deliveries; with delivery.report.only.error, successes cost nothing."""

    def __init__(self) -> None:
        self.count = 0
        self.first: KafkaError | None = None

    def __call__(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.count += 1
            self.first = self.first or err


def _watermarks(log: LogOffsets, partitions: list[tuple[str, int]]) -> list[tuple[int, int]]:
    low, high = log.watermarks(partitions)
    return [(low[tp], high[tp]) for tp in partitions]


def make_producer(config: KafkaConfig, compression: str) -> tuple[Producer, DeliveryErrors]:
    errors = DeliveryErrors()
    producer = Producer(
        config.producer(
            **{
                "compression.type": compression,
                # Exact offsets depend on records landing in the order they were produced.
                "enable.idempotence": True,
                "queue.buffering.max.messages": 1_000_000,
                "delivery.report.only.error": True,
                "on_delivery": errors,
                "logger": _librdkafka_log,
            }
        )
    )
    return producer, errors


class RecordShape(Protocol):
    """The records a profile's partitions get, but for their counts and sizes."""

    # Whether --poison may replace some records (their values are ours to break).
    poisonable: ClassVar[bool]

    def key(self, number: int) -> bytes:
        """Key number `number` (partition p draws from p * keys + j)."""
        ...

    def draws(self, rng: random.Random, keys: int, count: int) -> list[tuple[int, bool]]:
        """The key (0..keys-1) of each of a partition's `count` records, and whether the
        record is a tombstone (a null value)."""
        ...

    def values(self, partition: int, record_bytes: int) -> Callable[[int, int], bytes]:
        """The value of key number n's record number seq (how many records of n came before)."""
        ...


class ProbeRecords:
    """Keys `k-<n>` drawn at random, and small JSON values that say where they belong."""

    poisonable: ClassVar[bool] = True

    def key(self, number: int) -> bytes:
        return f"k-{number}".encode()

    def draws(self, rng: random.Random, keys: int, count: int) -> list[tuple[int, bool]]:
        return [(j, False) for j in rng.choices(range(keys), k=count)]

    def values(self, partition: int, record_bytes: int) -> Callable[[int, int], bytes]:
        pad = "x" * record_bytes

        def value(key_number: int, seq: int) -> bytes:
            head = f'{{"key": "k-{key_number}", "seq": {seq}, "partition": {partition}, "pad": "'
            return f'{head}{pad[: max(0, record_bytes - 2 - len(head))]}"}}'.encode()

        return value


def _null_key_value(partition: int, record_bytes: int) -> bytes:
    head = f'{{"key": null, "seq": -1, "partition": {partition}, "pad": "'
    return f'{head}{"x" * (record_bytes - 2 - len(head))}"}}'.encode()


def check_topic(cluster: ClusterInfo, topic: str, profile: Profile) -> None:
    """BadInput unless `topic` exists with a partition for each of the profile's."""
    existing = len(cluster.partitions([topic]))
    if existing < profile.partitions:
        raise BadInput(
            f"topic {topic!r} has {existing} partitions; profile {profile.name!r} "
            f"needs {profile.partitions}"
        )


def produce_profile(
    config: KafkaConfig,
    topic: str,
    profile: Profile,
    *,
    keys: int = 1_000,
    poison: float = 0.0,
    compression: str = "none",
    seed: int = 0,
    on_progress: Callable[[int], None] | None = None,
    shape: RecordShape | None = None,
) -> ProducedSummary:
    """Write `profile` to the existing `topic` and return exactly what was written.

    Assumes nobody else writes to the topic meanwhile: record i of partition p lands at
    offset start(p) + i, which is checked against the high watermarks afterwards.
    """
    shape = shape or ProbeRecords()
    _check_options(profile, keys, poison, compression, shape)
    poison_at = poison_positions(profile.total_records, poison)
    reader = OffsetReader(config)
    check_topic(reader.cluster, topic, profile)
    producer, delivery_errors = make_producer(config, compression)
    partitions = [(topic, p) for p in range(profile.partitions)]
    with reader:
        before = _watermarks(reader.log, partitions)
        rng = random.Random(seed)
        written = _Written()
        started = time.perf_counter()
        for p, count in enumerate(profile.counts):
            _produce_partition(
                producer,
                topic,
                p,
                count,
                start=before[p][1],
                record_bytes=profile.record_bytes[p],
                keys=keys,
                shape=shape,
                rng=rng,
                poison_at=poison_at,
                written=written,
                on_progress=on_progress,
            )
        _flush(producer, delivery_errors, topic)
        seconds = time.perf_counter() - started
        if on_progress:
            on_progress(written.done)
        after = _watermarks(reader.log, partitions)
    offsets = {p: (before[p][1], before[p][1] + count) for p, count in enumerate(profile.counts)}
    _check_nobody_else_wrote(topic, offsets, after)
    return ProducedSummary(
        topic=topic,
        keys_per_partition=keys,
        offsets=offsets,
        kinds=_kinds(written),
        value_bytes=written.value_bytes,
        seconds=seconds,
        retained_from={p: after[p][0] for p in offsets},
        poison=written.poison,
        _newest=written.newest,
    )


def _check_options(
    profile: Profile, keys: int, poison: float, compression: str, shape: RecordShape
) -> None:
    if keys < 1:
        raise BadInput(f"--keys {keys} must be at least 1")
    profile.check_fits(compression)
    if poison and not shape.poisonable:
        raise BadInput(f"--poison does not apply to profile {profile.name!r}")


def _flush(producer: Producer, delivery_errors: DeliveryErrors, topic: str) -> None:
    """Every record sent and acknowledged, or a TerminalError saying how many were not."""
    if producer.flush(FLUSH_TIMEOUT_S):
        raise TerminalError(f"records still unsent to {topic!r} after {FLUSH_TIMEOUT_S:.0f} s")
    if delivery_errors.first is not None:
        raise TerminalError(
            f"{delivery_errors.count} records failed to reach {topic!r}: "
            f"{delivery_errors.first.str()}"
        )


@dataclass
class _Written:
    """What the partitions produced so far hold: the summary's counts, poison and newest
    values (per partition, per key: the index of its last GOOD record or tombstone)."""

    poison: list[tuple[int, int, RecordKind]] = field(default_factory=list)
    newest: dict[int, dict[str, tuple[int, bytes | None]]] = field(default_factory=dict)
    value_bytes: int = 0
    tombstones: int = 0
    done: int = 0


def _produce_partition(
    producer: Producer,
    topic: str,
    p: int,
    count: int,
    *,
    start: int,
    record_bytes: int,
    keys: int,
    shape: RecordShape,
    rng: random.Random,
    poison_at: dict[int, RecordKind],
    written: _Written,
    on_progress: Callable[[int], None] | None,
) -> None:
    """Partition p's `count` records, landing from offset `start`: which key each is, its value
    or a tombstone, and the poison `poison_at` (numbered over all partitions) puts there."""
    done = written.done
    value = shape.values(p, record_bytes)
    base = p * keys
    key_bytes = [shape.key(base + j) for j in range(min(keys, count))]
    by_key: dict[int, tuple[int, bytes | None]] = {}
    seqs = [0] * len(key_bytes)
    draws = shape.draws(rng, len(key_bytes), count) if count else []
    # Counted in locals and added to `written` once: an attribute update a record slows the loop.
    value_bytes = 0
    tombstones = 0
    for i, (j, tombstone) in enumerate(draws):
        kind = poison_at.get(done + i)
        seq = seqs[j]
        body: bytes | None = None if tombstone else value(base + j, seq)
        key: bytes | None = key_bytes[j]
        if kind is None:
            seqs[j] = seq + 1
            by_key[j] = (i, body)
            tombstones += tombstone
        else:
            assert body is not None  # poisonable shapes make no tombstones
            written.poison.append((p, start + i, kind))
            if kind is RecordKind.INVALID_UTF8:
                seqs[j] = seq + 1
                body = _INVALID_UTF8_PREFIX + body
            elif kind is RecordKind.INVALID_JSON:
                seqs[j] = seq + 1
                body = body[:-2]
            else:
                key = None
                body = _null_key_value(p, record_bytes)
        value_bytes += len(body) if body is not None else 0
        produce(producer, topic, value=body, key=key, partition=p)
        if not (i + 1) % POLL_EVERY:
            producer.poll(0)
            if on_progress:
                on_progress(done + i + 1)
    written.value_bytes += value_bytes
    written.tombstones += tombstones
    written.done += count
    if by_key:
        written.newest[p] = {key_bytes[j].decode(): last for j, last in by_key.items()}


def _check_nobody_else_wrote(
    topic: str, offsets: dict[int, tuple[int, int]], after: list[tuple[int, int]]
) -> None:
    """TerminalError unless each partition's high watermark is where this run's records end:
    the offsets in the summary are only exact if no other producer wrote meanwhile."""
    moved = [p for p in offsets if after[p][1] != offsets[p][1]]
    if moved:
        raise TerminalError(
            f"high watermarks of {topic!r} partitions {moved} are not where this run left them: "
            "another producer wrote to the topic meanwhile"
        )


def _kinds(written: _Written) -> Counter[RecordKind]:
    """How many records of each kind were written: those neither poison nor tombstones GOOD."""
    kinds: Counter[RecordKind] = Counter(
        {
            RecordKind.GOOD: written.done - len(written.poison) - written.tombstones,
            RecordKind.TOMBSTONE: written.tombstones,
        }
    )
    kinds.update(kind for _, _, kind in written.poison)
    return kinds


def iter_kinds(summary: ProducedSummary) -> Iterator[tuple[RecordKind, int]]:
    """Kinds with their counts, GOOD first then the poison kinds, skipping absent ones."""
    for kind in (RecordKind.GOOD, RecordKind.TOMBSTONE, *POISON_KINDS):
        if summary.kinds[kind]:
            yield kind, summary.kinds[kind]
