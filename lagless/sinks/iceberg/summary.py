"""An Iceberg table's ledger (sinks/ledger.py): in the summaries of the snapshots lagless
commits, as Iceberg's Kafka Connect sink keeps its offsets.

Every snapshot of a batch carries `lagless.ranges`, the batch's ranges, and `lagless.held`, the
first offset above everything the table holds per partition once the batch is in: the held map
of the snapshot it was built on, raised by the batch. Commits are serialized by the catalog
(a commit built on an older snapshot fails and is built again), so the newest lagless snapshot
of the table's current lineage says what the table holds; lagless's compactions carry
`lagless.held` on (sinks/iceberg/maintenance.py), a snapshot another tool added carries nothing
and is passed over. A snapshot rolled back is not in the
lineage, so what it held counts as not held: the rows are gone with it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from lagless.sinks.ledger import TP, Batch

if TYPE_CHECKING:
    from pyiceberg.table import Table

RANGES = "lagless.ranges"
HELD = "lagless.held"


def held_in(table: Table) -> dict[TP, int]:
    """The first offset above everything the table holds, per partition (none: nothing)."""
    from pyiceberg.table.snapshots import ancestors_of

    held: dict[TP, int] = {}
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        summary = snapshot.summary
        if summary is None:
            continue
        if (ranges := summary.get(RANGES)) is not None:
            for tp, (_, end) in Batch.ranges_from_json(ranges).items():
                held[tp] = max(held.get(tp, 0), end)
        if (listed := summary.get(HELD)) is not None:
            for entry in json.loads(listed):
                tp = (entry["topic"], int(entry["partition"]))
                held[tp] = max(held.get(tp, 0), int(entry["end"]))
            break  # cumulative: every older snapshot's offsets are in it
    return held


def properties(held: Mapping[TP, int], batch: Batch) -> dict[str, str]:
    """The summary properties of a batch's snapshots, given what the table held before it."""
    after = dict(held)
    for tp, (_, end) in batch.covered.items():
        after[tp] = max(after.get(tp, 0), end)
    return {RANGES: batch.to_json(), **carried(after)}


def carried(held: Mapping[TP, int]) -> dict[str, str]:
    """The summary properties of a snapshot that changes no row (a compaction): what the table
    holds, as it was, so that expiring the snapshots before it keeps the ledger."""
    listed = [{"topic": t, "partition": p, "end": e} for (t, p), e in sorted(held.items())]
    return {HELD: json.dumps(listed, separators=(",", ":"))}
