"""Where Spark runs an import's tasks, as far as lagless can know it before Spark starts.

A local master (`local[*]`) runs the executors in the driver's own JVM: they see its disk. Any
other master (spark://, yarn, k8s://) may run them on other machines, so lagless assumes they
do not see it unless told (--shared-disk: workers on this machine, or a shared mount at the
same path). A store whose tasks write files into a folder of the driver's filesystem (SQLite's
staging, a local Parquet, Delta or Iceberg folder) is refused then, before anything is written:
at the first batch the driver would look for files the tasks wrote on other machines.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

from lagless.exceptions import BadInput
from lagless.sinks import Sink, Target

DEFAULT_MASTER = "local[*]"
MASTER_ENV = "LAGLESS_SPARK_MASTER"
_LOCAL_MASTER = re.compile(r"local(\[[^\]]*\])?")
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def master_url(master: str | None) -> str:
    """The master a session is started on: --master, else $LAGLESS_SPARK_MASTER, else local."""
    return master or os.environ.get(MASTER_ENV) or DEFAULT_MASTER


def executors_share_disk(master: str, shared_disk: bool) -> bool:
    if shared_disk or _LOCAL_MASTER.fullmatch(master):
        return True
    # A Spark Connect server on this machine runs the batches here, as its README section
    # asks of file stores (the same paths for the import and the server).
    address = urlsplit(master)
    return address.scheme == "sc" and address.hostname in _LOOPBACK


def check_tasks_reach_store(
    master: str, shared_disk: bool, sink: Sink, target: Target, tasks_write: bool
) -> None:
    """BadInput, in one line, when the store needs the driver's disk from executors that may
    not see it."""
    if executors_share_disk(master, shared_disk):
        return
    folder = sink.driver_folder_for_tasks(target, tasks_write)
    if folder is None:
        return
    raise BadInput(
        f"{sink.scheme}: Spark's tasks write files into {folder!r} on this machine, which the "
        f"executors of --master {master} may not see; {sink.without_shared_disk}, or pass "
        "--shared-disk if every executor sees this machine's disk at the same paths"
    )
