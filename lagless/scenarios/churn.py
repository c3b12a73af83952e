"""Report 003, rebalance storms: members join and leave all the time under an eager assignor
(range): every change revokes every partition from every member, and little gets read."""

from __future__ import annotations

import threading
import time
from collections import deque

from lagless.kafka.config import KafkaConfig
from lagless.scenarios.base import NumberedBacklog, member

RECORDS = 100
MEMBERS = 3
# A member comes or goes this often: several rebalances within the doctor's 10 s watch.
CHANGE_EVERY_S = 1.5


class Churn(NumberedBacklog):
    name = "003"
    title = (
        f"{MEMBERS} members of a range (eager) group; every {CHANGE_EVERY_S:g} s one leaves or a "
        "new one joins, and each change stops every member"
    )
    cure = "lagless import assigns partitions itself: no group membership, no rebalance"
    partitions = 6
    records = RECORDS

    def misbehave(
        self, config: KafkaConfig, sink_url: str, ready: threading.Event, stop: threading.Event
    ) -> None:
        joined = 0
        members: deque = deque()

        def join() -> None:
            nonlocal joined
            consumer = member(config, self.group, f"worker-{joined}", "range")
            consumer.subscribe([self.topic])
            members.append(consumer)
            joined += 1

        try:
            for _ in range(MEMBERS):
                join()
            next_change = time.monotonic() + CHANGE_EVERY_S
            leave_next = True
            while not stop.is_set():
                for consumer in list(members):
                    records = [m for m in consumer.consume(5, 0.02) if m.error() is None]
                    if records:
                        time.sleep(0.05 * len(records))  # processing
                        consumer.commit(message=records[-1], asynchronous=True)
                if any(c.assignment() for c in members):
                    ready.set()
                if ready.is_set() and time.monotonic() >= next_change:
                    if leave_next:
                        members.popleft().close()
                    else:
                        join()
                    leave_next = not leave_next
                    next_change = time.monotonic() + CHANGE_EVERY_S
        finally:
            for consumer in members:
                consumer.close()
