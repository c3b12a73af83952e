"""Named points where a test can have the import killed with SIGKILL, to prove a crash at any
of them loses and doubles nothing. Inert unless LAGLESS_FAILPOINT=<name>[:<nth time>] is set;
`<name>:<nth>:<seconds>` kills that long after the point is reached (a batch's commits run
beside the query, batch_writer.py: Spark records the batch as committed meanwhile).

`describe-group` is in the child process that asks DescribeGroups (kafka/group_describer.py):
it stands for librdkafka's abort there.

`mid-write` counts sink writes, not batches: a SQL store reaches it once for the target and
once more for the dead-letter table when a batch has dead letters.

`between-tables` is in a routed import's batch (importer/routing.py), after one table's part
committed and before the next table's: reached once per table after the first.

`mid-compaction` is reached with a compaction's new files written, not yet committed;
`mid-expiry` with old versions dropped, the files only they read not yet removed
(sinks/<store>/maintenance.py); `mid-fold` with a fold run beside the batches written and the
deletes made meanwhile moved, not yet committed (sinks/iceberg/maintenance.py)."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

NAMES = (
    "before-write",
    "mid-write",
    "after-write",
    "between-tables",
    "after-group-commit",
    "describe-group",
    "mid-compaction",
    "mid-expiry",
    "mid-fold",
)
_reached: Counter[str] = Counter()


def failpoint(name: str) -> None:
    wanted = os.environ.get("LAGLESS_FAILPOINT")
    if not wanted:
        return
    target, _, rest = wanted.partition(":")
    if target != name:
        return
    nth, _, delay_s = rest.partition(":")
    _reached[name] += 1
    if _reached[name] == int(nth or 1):
        time.sleep(float(delay_s or 0))
        os.kill(os.getpid(), signal.SIGKILL)
