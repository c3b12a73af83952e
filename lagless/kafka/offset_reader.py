"""The one way to the broker's metadata and offsets, as Spark's KafkaOffsetReader: one
connection (connection.py), asked through what each question is about:

- `log`: the partitions' watermarks and the offsets of a time (log_offsets.py);
- `groups`: a group's committed offsets, read and committed without joining it
  (group_offsets.py);
- `records`: a few records at given offsets (records.py);
- `cluster`: the topics' partitions and retention, the groups and their members
  (cluster_info.py).

Every command and the source's driver side ask here; Kafka's errors become lagless's own here:
BadInput when the broker cannot be reached at the start; later, a request that fails is retried
while the broker is away (lagless/retry.py), and past the budget a TransientError says so.
Executors read their ranges with their own consumers (source/reader.py): that is data, not
metadata.
"""

from __future__ import annotations

import threading
from functools import cached_property
from typing import Self

from lagless.kafka.cluster_info import ClusterInfo
from lagless.kafka.config import KafkaConfig
from lagless.kafka.connection import KafkaConnection
from lagless.kafka.embedded_log_offsets import EmbeddedLogOffsets, is_embedded
from lagless.kafka.group_offsets import GroupOffsets
from lagless.kafka.log_offsets import LogOffsets
from lagless.kafka.records import Records
from lagless.retry import DEFAULT_RETRY_S


class OffsetReader:
    def __init__(
        self,
        config: KafkaConfig,
        timeout_s: float = 10.0,
        retry_s: float = DEFAULT_RETRY_S,
        *,
        reached: bool = False,
        stop: threading.Event | None = None,
    ) -> None:
        """`timeout_s`: how long one request may take; `retry_s`: how long a broker that went
        away is waited for (lagless/retry.py), unless `stop` is set meanwhile. Before it first
        answered (`reached`), an unreachable broker is bad input (a wrong address) rather than
        one to wait for."""
        self.connection = KafkaConnection(config, timeout_s, retry_s, reached, stop)
        self.cluster = ClusterInfo(self.connection)
        self.groups = GroupOffsets(self.connection)
        self.records = Records(config)

    @cached_property
    def log(self) -> LogOffsets:
        # The embedded broker answers no ListOffsets by time: its logs are scanned instead.
        if is_embedded(self.connection.cluster_id()):
            return EmbeddedLogOffsets(self.connection)
        return LogOffsets(self.connection)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self.groups.close()
        self.cluster.close()
        if "log" in self.__dict__:  # made at its first use (a cached property)
            self.log.close()
