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
# Upsert: each partition's log time where the table's ledger ends (upsert_order.py), as HELD.
LOG_TIMES = "lagless.log-times"
# The records the batches skipped (Batch.skipped), all told per partition, cumulative as HELD.
SKIPPED = "lagless.skipped"


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


def log_times_in(table: Table) -> dict[TP, int]:
    """Each partition's log time where the table's ledger ends (none: not an upsert table's
    or not kept by an earlier lagless)."""
    return _newest(table, LOG_TIMES, "ms")


def skipped_in(table: Table) -> dict[TP, int]:
    """The records each partition's batches skipped, all told (none: left out): carried with
    HELD by every snapshot of lagless's since the first skip, so read from the newest."""
    return _newest(table, SKIPPED, "skipped", with_held=True)


def _newest(table: Table, name: str, field: str, with_held: bool = False) -> dict[TP, int]:
    """The newest snapshot's map `name` (cumulative, as HELD), each entry's `field`;
    `with_held`: the newest snapshot with HELD has it, or none has."""
    from pyiceberg.table.snapshots import ancestors_of

    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        summary = snapshot.summary
        listed = summary.get(name) if summary is not None else None
        if listed is not None:
            return {(e["topic"], int(e["partition"])): int(e[field]) for e in json.loads(listed)}
        if with_held and summary is not None and summary.get(HELD) is not None:
            break
    return {}


def properties(
    found: Table, held: Mapping[TP, int], batch: Batch, log_times: Mapping[TP, int] | None = None
) -> dict[str, str]:
    """The summary properties of a batch's snapshots, given the table before it (`found`),
    what it held then (and, upsert, its log times then)."""
    after = dict(held)
    for tp, (_, end) in batch.covered.items():
        after[tp] = max(after.get(tp, 0), end)
    times = None
    if log_times is not None and (log_times or batch.log_times):
        times = {**log_times}
        for tp, ms in batch.log_times.items():
            times[tp] = max(times.get(tp, ms), ms)
    skipped = skipped_in(found)
    for tp, n in batch.skipped.items():
        if n and tp in batch.covered:
            skipped[tp] = skipped.get(tp, 0) + n
    return {RANGES: batch.to_json(), **carried(after, times, skipped)}


def carried(
    held: Mapping[TP, int],
    log_times: Mapping[TP, int] | None = None,
    skipped: Mapping[TP, int] | None = None,
) -> dict[str, str]:
    """The summary properties that say what the table holds (and, upsert, its log times; the
    offsets its ledger skipped): a batch's, and those of a snapshot that changes no row (a
    compaction), as they were, so that expiring the snapshots before it keeps the ledger."""
    found = {HELD: _listed(held, "end")}
    if log_times:
        found[LOG_TIMES] = _listed(log_times, "ms")
    if skipped:
        found[SKIPPED] = _listed(skipped, "skipped")
    return found


def _listed(values: Mapping[TP, int], field: str) -> str:
    listed = [{"topic": t, "partition": p, field: n} for (t, p), n in sorted(values.items())]
    return json.dumps(listed, separators=(",", ":"))
