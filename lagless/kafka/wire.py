"""Three requests written by hand over plain TCP, each for a whole fleet at once: the committed
offsets of many groups in one request per coordinator (OffsetFetch v8, KIP-709, after a
batched FindCoordinator v4, KIP-699), and the log start and end of many partitions in one
request per leader (ListOffsets v4).

librdkafka's admin client takes one group per ListConsumerGroupOffsets: 2,000 groups cost its
process 0.8 CPU-seconds a round (a Python future and a request each), and noida-db 1 s more,
as it answers "every partition" of a group by scanning every group's offsets. Here one request
carries a thousand groups, each naming the partitions it is known to read (0.05 s here, 0.01 s
of noida-db's). The log bounds of 24,000 partitions through librdkafka's consumer cost 0.25
CPU-seconds (a TopicPartition object each way per partition), 0.05 s here. Nor can a dropped
connection abort the process, as it does librdkafka's during a coordinator's request
(group_describer.py): a socket error is that round's reason for what was asked there.

Used only where it can be: a PLAINTEXT listener (no TLS, no SASL: those stay librdkafka's)
whose ApiVersions offers OffsetFetch v8, FindCoordinator v4 and ListOffsets v4 (Kafka 3.0 and
later, noida-db). The embedded broker answers OffsetFetch up to v6: it is asked the
librdkafka way (the child process for the groups, log_offsets.py for the bounds).
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import suppress

from confluent_kafka import KafkaError

from lagless.kafka import TP

API_OFFSET_FETCH, OFFSET_FETCH_VERSION = 9, 8
API_FIND_COORDINATOR, FIND_COORDINATOR_VERSION = 10, 4
API_VERSIONS = 18
API_LIST_OFFSETS, LIST_OFFSETS_VERSION = 2, 4
# ListOffsets' timestamps that ask for the log's start and end.
EARLIEST, LATEST = -2, -1
# Partitions per ListOffsets request.
PARTITIONS_PER_REQUEST = 5000
GROUP_KEY = 0
# Groups per OffsetFetch request: a round's requests stay a few hundred KB each.
GROUPS_PER_REQUEST = 1000
# The coordinator moved, or is loading: found again at the next round.
_COORDINATOR_ERRORS = frozenset({14, 15, 16})
# A group the coordinator does not know has committed nothing (Kafka answers it so since 3.x).
_GROUP_ID_NOT_FOUND = 69

# A group's committed offsets and the metadata they were committed with (each distinct one),
# or why the broker did not tell them.
Committed = tuple[dict[TP, int], set[str]] | str
Address = tuple[str, int]
# A connection that failed, or an answer that cannot be read: what was asked there is failed
# for this round, the connection dropped.
_BROKEN = (OSError, ValueError, IndexError, struct.error)


class WireClient:
    """Committed offsets and log bounds through one connection per broker, kept between
    rounds, as is each group's coordinator; one request at a time."""

    def __init__(self, bootstrap: str, timeout_s: float) -> None:
        self._bootstrap = [_address(entry) for entry in bootstrap.split(",") if entry.strip()]
        self._timeout_s = timeout_s
        self._connections: dict[Address, _Connection] = {}
        self._coordinators: dict[str, Address] = {}
        self._lock = threading.Lock()  # one request at a time on each connection
        self._unanswered: dict[Address, float] = {}
        """When a broker last failed a request (timed out, refused, broken answer): it is not
        asked again within the timeout. serve looks at a fleet a part at a time, and while a
        broker is away each part would otherwise wait for its own timeout."""

    def usable(self) -> bool:
        """The bootstrap broker answers OffsetFetch v8, FindCoordinator v4 and ListOffsets
        v4. Raises OSError when it cannot be reached."""
        with self._lock:
            answer = self._any_broker()[1].call(API_VERSIONS, 0, b"", flexible=False)
        if answer.int16() != 0:
            return False
        versions = {}
        for _ in range(answer.int32()):
            key, _lowest, highest = answer.int16(), answer.int16(), answer.int16()
            versions[key] = highest
        return (
            versions.get(API_OFFSET_FETCH, -1) >= OFFSET_FETCH_VERSION
            and versions.get(API_FIND_COORDINATOR, -1) >= FIND_COORDINATOR_VERSION
            and versions.get(API_LIST_OFFSETS, -1) >= LIST_OFFSETS_VERSION
        )

    def log_bounds(
        self, leaders: Mapping[TP, Address]
    ) -> tuple[dict[TP, int], dict[TP, int], dict[TP, str]]:
        with self._lock:
            return self._log_bounds(leaders)

    def _log_bounds(
        self, leaders: Mapping[TP, Address]
    ) -> tuple[dict[TP, int], dict[TP, int], dict[TP, str]]:
        """(log start, log end, failed) of each partition, asked of its leader: the end is the
        high watermark (read_uncommitted), as log_offsets.py's log_bounds. A partition the
        broker did not answer for is in neither mapping but in `failed`, with the reason."""
        by_leader: dict[Address, list[TP]] = {}
        for tp, leader in leaders.items():
            by_leader.setdefault(leader, []).append(tp)
        low: dict[TP, int] = {}
        end: dict[TP, int] = {}
        failed: dict[TP, str] = {}
        for address, partitions in by_leader.items():
            for start in range(0, len(partitions), PARTITIONS_PER_REQUEST):
                part = partitions[start : start + PARTITIONS_PER_REQUEST]
                for spec, found in ((EARLIEST, low), (LATEST, end)):
                    try:
                        answer = self._connection(address).call(
                            API_LIST_OFFSETS,
                            LIST_OFFSETS_VERSION,
                            _list_offsets(part, spec),
                            flexible=False,
                        )
                        _offsets_listed(answer, found, failed)
                    except _BROKEN as exc:
                        self._unanswering(address)
                        failed.update(
                            dict.fromkeys(part, f"broker {address[0]}:{address[1]}: {exc}")
                        )
        for tp in leaders:
            if tp not in failed and (tp not in low or tp not in end):
                failed[tp] = "the broker's answer left the partition out"
        for tp in failed:
            low.pop(tp, None)
            end.pop(tp, None)
        return low, end, failed

    def fetch(self, groups: Mapping[str, Sequence[TP] | None]) -> dict[str, Committed]:
        """Each group's committed offsets: of the partitions named (None: every partition it
        committed on), or the reason the broker did not tell them."""
        with self._lock:
            return self._fetch(groups)

    def _fetch(self, groups: Mapping[str, Sequence[TP] | None]) -> dict[str, Committed]:
        found: dict[str, Committed] = {}
        unknown = [group for group in groups if group not in self._coordinators]
        if unknown:
            found.update(self._find_coordinators(unknown))
        by_coordinator: dict[tuple[str, int], list[str]] = {}
        for group in groups:
            if group not in found:
                by_coordinator.setdefault(self._coordinators[group], []).append(group)
        for address, asked in by_coordinator.items():
            for start in range(0, len(asked), GROUPS_PER_REQUEST):
                part = asked[start : start + GROUPS_PER_REQUEST]
                try:
                    answer = self._connection(address).call(
                        API_OFFSET_FETCH, OFFSET_FETCH_VERSION, _offset_fetch(part, groups)
                    )
                    told = _offsets(answer)
                except _BROKEN as exc:
                    self._unanswering(address)
                    told = dict.fromkeys(part, f"coordinator {address[0]}:{address[1]}: {exc}")
                for group in part:
                    answered = told.get(group, "the coordinator's answer left the group out")
                    if isinstance(answered, int):
                        self._coordinators.pop(group, None)
                        answered = KafkaError(answered).str()
                    found[group] = answered
        return found

    def close(self) -> None:
        with self._lock:
            for address in list(self._connections):
                self._drop(address)

    def _find_coordinators(self, groups: Sequence[str]) -> dict[str, Committed]:
        """Learns the coordinator of each group; returns why it could not, per group."""
        failed: dict[str, Committed] = {}
        body = struct.pack(">b", GROUP_KEY) + _array(_string(group) for group in groups) + _NO_TAGS
        address: Address | None = None
        try:
            address, connection = self._any_broker()
            answer = connection.call(API_FIND_COORDINATOR, FIND_COORDINATOR_VERSION, body)
            answer.int32()  # throttle_time_ms
            for _ in range(answer.count()):
                key, _node = answer.string(), answer.int32()
                host, port, error, message = (
                    answer.string(),
                    answer.int32(),
                    answer.int16(),
                    answer.string(),
                )
                answer.skip_tags()
                if error:
                    failed[key or ""] = message or KafkaError(error).str()
                else:
                    self._coordinators[key or ""] = (host or "", port)
        except _BROKEN as exc:
            if address is not None:
                self._unanswering(address)
            return dict.fromkeys(groups, f"FindCoordinator: {exc}")
        for group in groups:
            if group not in self._coordinators and group not in failed:
                failed[group] = "FindCoordinator's answer left the group out"
        return failed

    def _any_broker(self) -> tuple[Address, _Connection]:
        error: OSError | None = None
        for address in self._bootstrap:
            try:
                return address, self._connection(address)
            except OSError as exc:
                error = exc
        raise error or OSError("no bootstrap address")

    def _connection(self, address: tuple[str, int]) -> _Connection:
        failed_at = self._unanswered.get(address)
        if failed_at is not None and time.monotonic() - failed_at < self._timeout_s:
            raise ConnectionError(
                f"{address[0]}:{address[1]} failed a request {time.monotonic() - failed_at:.1f}"
                f" s ago; asked again {self._timeout_s:g} s after"
            )
        if address not in self._connections:
            try:
                self._connections[address] = _Connection(address, self._timeout_s)
            except OSError:
                self._unanswered[address] = time.monotonic()
                raise
        return self._connections[address]

    def _unanswering(self, address: tuple[str, int]) -> None:
        """The broker failed a request: its connection dropped, and not asked again within
        the timeout."""
        self._drop(address)
        self._unanswered[address] = time.monotonic()

    def _drop(self, address: tuple[str, int]) -> None:
        connection = self._connections.pop(address, None)
        if connection is not None:
            connection.close()
        for group in [g for g, at in self._coordinators.items() if at == address]:
            del self._coordinators[group]


def _address(entry: str) -> tuple[str, int]:
    host, _, port = entry.strip().rpartition(":")
    return host.strip("[]"), int(port)


class _Connection:
    """One broker connection; a request waits for its answer (the timeout is the socket's)."""

    def __init__(self, address: tuple[str, int], timeout_s: float) -> None:
        self._socket = socket.create_connection(address, timeout=timeout_s)
        self._socket.settimeout(timeout_s)
        self._correlation = 0

    def call(self, api: int, version: int, body: bytes, flexible: bool = True) -> _Reader:
        self._correlation += 1
        client = b"lagless"
        header = struct.pack(">hhih", api, version, self._correlation, len(client)) + client
        message = header + (_NO_TAGS if flexible else b"") + body
        self._socket.sendall(struct.pack(">i", len(message)) + message)
        size = struct.unpack(">i", self._read(4))[0]
        answer = _Reader(self._read(size))
        if answer.int32() != self._correlation:
            raise ValueError("an answer to another request")
        if flexible and api != API_VERSIONS:
            answer.skip_tags()
        return answer

    def _read(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = self._socket.recv(min(size - len(data), 1 << 20))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            data += chunk
        return bytes(data)

    def close(self) -> None:
        with suppress(OSError):
            self._socket.close()


_NO_TAGS = b"\x00"


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(value: str) -> bytes:
    encoded = value.encode()
    return _varint(len(encoded) + 1) + encoded


def _array(items: Iterator[bytes] | list[bytes]) -> bytes:
    parts = list(items)
    return _varint(len(parts) + 1) + b"".join(parts)


def _offset_fetch(groups: Sequence[str], named: Mapping[str, Sequence[TP] | None]) -> bytes:
    """OffsetFetch v8's body: each group with its topics and partitions (null: all)."""
    entries = []
    for group in groups:
        partitions = named[group]
        if partitions is None:
            topics = b"\x00"  # a null array: every partition the group committed on
        else:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in partitions:
                by_topic.setdefault(topic, []).append(partition)
            topics = _array(
                _string(topic)
                + _varint(len(numbers) + 1)
                + struct.pack(f">{len(numbers)}i", *numbers)
                + _NO_TAGS
                for topic, numbers in by_topic.items()
            )
        entries.append(_string(group) + topics + _NO_TAGS)
    return _array(entries) + b"\x00" + _NO_TAGS  # require_stable false


def _list_offsets(partitions: Sequence[TP], spec: int) -> bytes:
    """ListOffsets v4's body: every partition at `spec` (EARLIEST or LATEST), read_uncommitted."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    body = [struct.pack(">ibi", -1, 0, len(by_topic))]  # replica_id, isolation_level
    for topic, numbers in by_topic.items():
        name = topic.encode()
        body.append(struct.pack(f">h{len(name)}si", len(name), name, len(numbers)))
        body += [struct.pack(">iiq", number, -1, spec) for number in numbers]
    return b"".join(body)


def _offsets_listed(answer: _Reader, found: dict[TP, int], failed: dict[TP, str]) -> None:
    """The offsets of ListOffsets v4's answer into found, its errors into failed."""
    answer.int32()  # throttle_time_ms
    for _ in range(answer.int32()):
        topic = answer.string16()
        for partition, error, _timestamp, offset, _epoch in answer.listed(answer.int32()):
            if error:
                failed[(topic, partition)] = KafkaError(error).str()
            elif offset < 0:
                failed[(topic, partition)] = f"no offset in the broker's answer ({offset})"
            else:
                found[(topic, partition)] = offset


def _offsets(answer: _Reader) -> dict[str, Committed | int]:
    """Each group's offsets from OffsetFetch v8's answer; an int: a coordinator error."""
    answer.int32()  # throttle_time_ms
    found: dict[str, Committed | int] = {}
    for _ in range(answer.count()):
        group = answer.string() or ""
        told: dict[TP, int] = {}
        marks: set[str] = set()
        errors: list[int] = []
        for _ in range(answer.count()):
            topic = answer.string() or ""
            answer.committed(topic, told, marks, errors)
            answer.skip_tags()
        error = answer.int16()
        answer.skip_tags()
        if error in _COORDINATOR_ERRORS:
            found[group] = error
        elif error == _GROUP_ID_NOT_FOUND:
            found[group] = ({}, set())
        elif error or errors:
            first = error or errors[0]
            found[group] = f"{KafkaError(first).str()} ({len(errors)} partitions)"
        else:
            found[group] = (told, marks)
    return found


class _Reader:
    """Reads a Kafka answer, field by field."""

    _LISTED = struct.Struct(">ihqqi")
    # partition_index, committed_offset, committed_leader_epoch
    _COMMITTED = struct.Struct(">iqi")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._at = 0

    def int16(self) -> int:
        (value,) = struct.unpack_from(">h", self._data, self._at)
        self._at += 2
        return int(value)

    def int32(self) -> int:
        (value,) = struct.unpack_from(">i", self._data, self._at)
        self._at += 4
        return int(value)

    def committed(
        self, topic: str, told: dict[TP, int], marks: set[str], errors: list[int]
    ) -> None:
        """A topic's partitions in OffsetFetch v8's answer: each committed offset into told,
        its metadata into marks, each partition's error into errors. One loop with its
        fields read in place: serve reads every partition of every group each round."""
        data, fields = self._data, self._COMMITTED.unpack_from
        seen: set[bytes] = set()
        count = self.count()
        at = self._at
        for _ in range(count):
            partition, offset, _epoch = fields(data, at)
            at += 16
            size = data[at]
            if size < 0x80:  # the metadata's length + 1 in one byte: the usual case
                at += 1
                metadata = data[at : at + size - 1] if size > 1 else b""
                at += max(0, size - 1)
            else:
                self._at = at
                read = self.string()
                metadata, at = (read or "").encode(), self._at
            error = (data[at] << 8 | data[at + 1]) - ((data[at] & 0x80) << 9)
            at += 2
            if data[at]:  # tagged fields: none but in a newer broker's answer
                self._at = at
                self.skip_tags()
                at = self._at
            else:
                at += 1
            if error:
                errors.append(error)
            elif offset >= 0:
                told[(topic, partition)] = offset
                seen.add(metadata)
        self._at = at
        # Up to a NUL, as librdkafka reads it: confluent_kafka commits the metadata with its C
        # string's terminator.
        marks.update(mark.split(b"\x00", 1)[0].decode() for mark in seen)

    def listed(self, count: int) -> Iterator[tuple[int, int, int, int, int]]:
        """`count` partitions' partition, error_code, timestamp, offset, leader_epoch
        (ListOffsets v4)."""
        size = count * self._LISTED.size
        if count < 0 or self._at + size > len(self._data):
            raise ValueError("an answer shorter than it says")
        found = self._LISTED.iter_unpack(memoryview(self._data)[self._at : self._at + size])
        self._at += size
        return found

    def string16(self) -> str:
        size = self.int16()
        value = self._data[self._at : self._at + max(0, size)].decode()
        self._at += max(0, size)
        return value

    def varint(self) -> int:
        value = shift = 0
        while True:
            byte = self._data[self._at]
            self._at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    def count(self) -> int:
        """A compact array's length (a null array: none)."""
        return max(0, self.varint() - 1)

    def string(self) -> str | None:
        size = self.varint() - 1
        if size < 0:
            return None
        value = self._data[self._at : self._at + size].decode()
        self._at += size
        return value

    def skip_tags(self) -> None:
        for _ in range(self.varint()):
            self.varint()  # the tag
            size = self.varint()  # read before the position is: `self._at += ...` would not
            self._at += size
