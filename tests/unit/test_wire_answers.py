"""OffsetFetch v8 and ListOffsets v4 answers read by kafka/wire.py, built byte by byte: the
fields a broker here never sends (long metadata, tagged fields, null metadata, errors) read
as the protocol says. The requests themselves: tests/integration/test_wire.py, on noida-db."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

import pytest
from confluent_kafka import KafkaError

from lagless.kafka.wire import (
    _NO_TAGS,
    WireClient,
    _offsets,
    _offsets_listed,
    _Reader,
    _string,
    _varint,
)

LONG = "lagless:" + "x" * 300  # its length needs a two-byte varint


def _partition(
    number: int, offset: int, metadata: bytes, error: int = 0, tags: bytes = _NO_TAGS
) -> bytes:
    return struct.pack(">iqi", number, offset, -1) + metadata + struct.pack(">h", error) + tags


def _group(name: str, topic: str, partitions: list[bytes], error: int = 0) -> bytes:
    return (
        _string(name)
        + _varint(2)
        + _string(topic)
        + _varint(len(partitions) + 1)
        + b"".join(partitions)
        + _NO_TAGS
        + struct.pack(">h", error)
        + _NO_TAGS
    )


def test_offset_fetch_answers_each_field_as_the_protocol_says() -> None:
    one_tag = _varint(1) + _varint(7) + _varint(3) + b"abc"  # a tagged field, skipped
    answer = struct.pack(">i", 0) + _varint(5) + b"".join(
        [
            _group("a", "t", [
                _partition(0, 5, _string(LONG + "\x00junk")),
                _partition(1, 6, _string(LONG), tags=one_tag),
                _partition(2, -1, _string("")),  # nothing committed there
            ]),
            _group("b", "u", [_partition(0, 3, b"\x00"), _partition(1, 4, _string(""))]),
            _group("c", "t", [_partition(0, 1, _string("")), _partition(1, 0, b"\x00", error=-1)]),
            _group("d", "t", [], error=14),
        ]
    )  # fmt: skip
    found = _offsets(_Reader(answer))
    assert found["a"] == ({("t", 0): 5, ("t", 1): 6}, {LONG})
    assert found["b"] == ({("u", 0): 3, ("u", 1): 4}, {""})  # null metadata reads as none
    assert found["c"] == f"{KafkaError(-1).str()} (1 partitions)"  # the error's sign kept
    assert found["d"] == 14  # the coordinator is loading: asked again next round


def test_list_offsets_answers_offsets_errors_and_a_short_answer() -> None:
    topic = b"t"
    head = struct.pack(">ii", 0, 1) + struct.pack(">h1si", 1, topic, 3)
    body = struct.pack(">ihqqi", 0, 0, -1, 7, 0) + struct.pack(">ihqqi", 1, 6, -1, -1, 0)
    body += struct.pack(">ihqqi", 2, 0, -1, -1, 0)
    found: dict[tuple[str, int], int] = {}
    failed: dict[tuple[str, int], str] = {}
    _offsets_listed(_Reader(head + body), found, failed)
    assert found == {("t", 0): 7}
    assert set(failed) == {("t", 1), ("t", 2)} and "no offset" in failed[("t", 2)]
    with pytest.raises(ValueError):
        _offsets_listed(_Reader(head + body[:-1]), {}, {})


def test_a_broker_that_did_not_answer_is_not_asked_again_within_the_timeout() -> None:
    """A listener that accepts and never answers (a broker stopped mid-flight; a real socket,
    no broker behind it, which is what is tested): the first fetch waits for its timeout, the
    next ones within the timeout fail at once without connecting (serve's parts of a fleet
    would each wait otherwise), and after the timeout it is asked again."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []  # held open, never answered

    def accept() -> None:
        with contextlib.suppress(OSError):  # the listener closed
            while True:
                accepted.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    client = WireClient(f"127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.5)
    try:
        started = time.monotonic()
        first = client.fetch({"g1": None})
        waited = time.monotonic() - started
        started = time.monotonic()
        second = client.fetch({"g2": None})
        again = time.monotonic() - started
        connections = len(accepted)
        time.sleep(0.6)
        third = client.fetch({"g3": None})
        assert len(accepted) == connections + 1, "asked again after the timeout"
    finally:
        client.close()
        listener.close()
        for connection in accepted:
            connection.close()
    assert waited >= 0.5 and "timed out" in str(first["g1"])
    assert again < 0.1 and "failed a request" in str(second["g2"])
    assert "timed out" in str(third["g3"])
