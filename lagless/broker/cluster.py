"""The embedded dev broker: librdkafka's mock cluster, listening on loopback TCP.

It lives inside the process that starts it; other processes (Spark workers, kcat) reach it
over TCP through `bootstrap`. It keeps about 5 MB per partition (RETENTION), dropping older
records as retention would; librdkafka fixes that size. Less, and retention by time, are kept
by a thread of lagless's (retention.py).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterable
from types import TracebackType

from lagless.broker.librdkafka import err2str, library
from lagless.broker.retention import Retention
from lagless.exceptions import BadInput, TerminalError

_PRODUCER = 0

# What librdkafka's mock keeps of a partition (rdkafka_mock.c, fixed there): past either, it
# deletes the oldest produce batches, as retention would.
RETENTION_BYTES = 5 * 1024 * 1024
RETENTION_BATCHES = 100_000
RETENTION = (
    f"keeps about {RETENTION_BYTES // (1024 * 1024)} MB ({RETENTION_BATCHES:,} produce batches) "
    "a partition, deleting the oldest records past it"
)

# Kafka API keys, for injected request errors.
API_KEYS = {
    "Produce": 0,
    "Fetch": 1,
    "ListOffsets": 2,
    "Metadata": 3,
    "OffsetCommit": 8,
    "OffsetFetch": 9,
    "FindCoordinator": 10,
    "JoinGroup": 11,
    "Heartbeat": 12,
    "SyncGroup": 14,
}


def parse_topic_spec(spec: str) -> tuple[str, int]:
    """`NAME:PARTITIONS` (partitions default to 1)."""
    name, _, count = spec.partition(":")
    if not name:
        raise BadInput(f"topic {spec!r} has no name (expected NAME:PARTITIONS)")
    try:
        partitions = int(count) if count else 1
    except ValueError:
        raise BadInput(f"topic {spec!r}: partitions {count!r} is not a number") from None
    if partitions < 1:
        raise BadInput(f"topic {spec!r}: partitions must be at least 1")
    return name, partitions


class EmbeddedBroker:
    """A context manager running a mock Kafka cluster of `brokers` brokers.

    >>> with EmbeddedBroker(topics={"orders": 4}) as broker:
    ...     print(broker.bootstrap)
    """

    def __init__(
        self,
        brokers: int = 1,
        topics: dict[str, int] | None = None,
        *,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
    ) -> None:
        """`retention_ms`, `retention_bytes`: a partition's retention by time and by size, kept
        by lagless (retention.py); by size, at most the RETENTION_BYTES the mock keeps."""
        if brokers < 1:
            raise BadInput("--brokers must be at least 1")
        if retention_bytes is not None and not 0 < retention_bytes <= RETENTION_BYTES:
            raise BadInput(
                f"--retention-bytes {retention_bytes:,} is not between 1 and {RETENTION_BYTES:,}: "
                "the embedded broker (librdkafka's mock) keeps no more of a partition; "
                "--compression zstd on gen keeps about twice the records"
            )
        if retention_ms is not None and retention_ms < 1:
            raise BadInput(f"--retention-ms {retention_ms} is not a positive number of ms")
        self.brokers = brokers
        self._initial_topics = dict(topics or {})
        self._retention = (retention_ms, retention_bytes)
        self._keeper: Retention | None = None
        self._rk: int | None = None
        self._mc: int | None = None
        self._lock = threading.Lock()
        self.bootstrap = ""

    def start(self) -> EmbeddedBroker:
        lib = library()
        conf = lib.rd_kafka_conf_new()
        errstr = ctypes.create_string_buffer(512)
        # Notices such as "no bootstrap.servers" are noise for a handle that only hosts the mock.
        lib.rd_kafka_conf_set(conf, b"log_level", b"3", errstr, len(errstr))
        rk = lib.rd_kafka_new(_PRODUCER, conf, errstr, len(errstr))
        if not rk:
            raise TerminalError(f"embedded broker: rd_kafka_new failed: {errstr.value.decode()}")
        mc = lib.rd_kafka_mock_cluster_new(rk, self.brokers)
        if not mc:
            lib.rd_kafka_destroy(rk)
            raise TerminalError("embedded broker: rd_kafka_mock_cluster_new failed")
        self._rk, self._mc = rk, mc
        self.bootstrap = lib.rd_kafka_mock_cluster_bootstraps(mc).decode()
        for name, partitions in self._initial_topics.items():
            self.create_topic(name, partitions)
        if any(limit is not None for limit in self._retention):
            self._keeper = Retention(self.bootstrap, self.delete_records, *self._retention)
            self._keeper.start()
        return self

    @property
    def retention(self) -> str:
        """What it keeps of a partition, as `lagless broker` says at its start."""
        retention_ms, retention_bytes = self._retention
        kept = f"keeps {retention_bytes:,} bytes a partition" if retention_bytes else RETENTION
        return f"{kept}, and records newer than {retention_ms:,} ms" if retention_ms else kept

    def stop(self) -> None:
        if self._keeper is not None:
            self._keeper.stop()
            self._keeper = None
        with self._lock:
            lib = library()
            if self._mc:
                lib.rd_kafka_mock_cluster_destroy(self._mc)
            if self._rk:
                lib.rd_kafka_destroy(self._rk)
            self._mc = self._rk = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def _cluster(self) -> int:
        if not self._mc:
            raise TerminalError("embedded broker is not running")
        return self._mc

    def _check(self, code: int, what: str) -> None:
        if code:
            raise TerminalError(f"embedded broker: {what}: {err2str(code)}")

    def create_topic(self, name: str, partitions: int, replication: int = 1) -> None:
        replication = min(replication, self.brokers)
        code = library().rd_kafka_mock_topic_create(
            self._cluster, name.encode(), partitions, replication
        )
        self._check(code, f"create topic {name!r}")

    def create_topics(self, specs: Iterable[str]) -> None:
        for spec in specs:
            self.create_topic(*parse_topic_spec(spec))

    def broker_ids(self) -> list[int]:
        return list(range(1, self.brokers + 1))

    def set_down(self, broker_id: int | None = None) -> None:
        """Take one broker (or all, when None) off the network."""
        for bid in [broker_id] if broker_id else self.broker_ids():
            self._check(
                library().rd_kafka_mock_broker_set_down(self._cluster, bid), f"broker {bid} down"
            )

    def set_up(self, broker_id: int | None = None) -> None:
        for bid in [broker_id] if broker_id else self.broker_ids():
            self._check(
                library().rd_kafka_mock_broker_set_up(self._cluster, bid), f"broker {bid} up"
            )

    def set_rtt(self, rtt_ms: int, broker_id: int | None = None) -> None:
        """Delay every response of a broker (or all) by `rtt_ms`."""
        for bid in [broker_id] if broker_id else self.broker_ids():
            code = library().rd_kafka_mock_broker_set_rtt(self._cluster, bid, rtt_ms)
            self._check(code, f"broker {bid} rtt")

    def push_request_errors(self, api: str | int, errors: list[int]) -> None:
        """Answer the next len(errors) requests of `api` with these Kafka error codes, in order."""
        key = API_KEYS[api] if isinstance(api, str) else api
        array = (ctypes.c_int * len(errors))(*errors)
        library().rd_kafka_mock_push_request_errors_array(self._cluster, key, len(errors), array)

    def clear_request_errors(self, api: str | int) -> None:
        key = API_KEYS[api] if isinstance(api, str) else api
        library().rd_kafka_mock_clear_request_errors(self._cluster, key)

    def delete_records(self, topic: str, partition: int, before_offset: int) -> None:
        """Move the partition's log start to before_offset, as retention or DeleteRecords would
        (the mock answers no DeleteRecords request, so this is its own control). Unlike Kafka,
        the mock also moves it back to an offset below its start, where the produce batches it
        deleted are not: callers delete forward (retention.py does)."""
        code = library().rd_kafka_mock_partition_delete_records(
            self._cluster, topic.encode(), partition, before_offset
        )
        self._check(code, f"delete records of {topic}:{partition} before {before_offset}")
