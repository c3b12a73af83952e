"""One admin client to the broker, shared by everything that asks it (offset_reader.py), with
the retry budget of its requests and the translation of Kafka's errors into lagless's own.

An unreachable broker is BadInput at the start (a wrong address); once it answered, a request
that fails is retried while the broker is away (lagless/retry.py), and past the budget a
TransientError says so.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar, cast

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata

from lagless.exceptions import BadInput
from lagless.kafka.config import KafkaConfig
from lagless.retry import retried

T = TypeVar("T")


@dataclass
class KafkaConnection:
    """Made by OffsetReader, which says what its settings mean."""

    config: KafkaConfig
    timeout_s: float
    retry_s: float
    reached: bool
    # A stop request that ends a wait for a broker that is away (retry.py); None: waits last
    # the budget.
    stop: threading.Event | None = None
    admin: AdminClient = field(init=False)
    _cluster_id: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.admin = AdminClient(self.config.admin())

    def metadata(self, named: Iterable[str] = ()) -> ClusterMetadata:
        """The cluster's topics and partitions. Once the broker answered, retried while it is
        away, and while it leads none of the `named` topics' partitions yet (a restarting
        broker may answer before it does)."""
        if not self.reached:
            try:
                found = self.admin.list_topics(timeout=self.timeout_s)
            except KafkaException as exc:
                raise BadInput(
                    f"cannot reach the broker at {self.config.bootstrap} within "
                    f"{self.timeout_s:.0f} s ({reason(exc)})"
                ) from None
            self.reached = True
        else:
            wanted = set(named)

            def answered() -> ClusterMetadata:
                found = self.admin.list_topics(timeout=self.timeout_s)
                failing = sorted(t for t in wanted if t in found.topics and found.topics[t].error)
                if failing:
                    raise KafkaException(found.topics[failing[0]].error)
                return found

            found = self.retried(answered, "listing topics")
        self._cluster_id = found.cluster_id
        return found

    def cluster_id(self) -> str:
        """The cluster's id, from the last metadata asked (asked now when none was)."""
        if self._cluster_id is None:
            self.metadata()
        return self._cluster_id or ""

    def retried(self, attempt: Callable[[], T], doing: str) -> T:
        """attempt() again while the broker is away, up to retry_s: a failure here stalls the
        query, and past the budget the import exits 75."""
        return retried(
            attempt,
            what=f"the broker at {self.config.bootstrap} ({doing})",
            budget_s=self.retry_s,
            retry_on=(KafkaException,),
            reason=lambda exc: reason(cast(KafkaException, exc)),
            stop=self.stop,
        )


def reason(exc: KafkaException) -> str:
    """Kafka's error as one line of text."""
    err = exc.args[0] if exc.args else exc
    return str(getattr(err, "str", lambda: err)())
