"""Where an import resumes: each table's ledger read and held against the log and the
checkpoint, before anything is written (sinks/ledger.py decides what a table holds).

- Each table's ledger gives the offsets it holds; a ledger that contradicts the log (a topic
  deleted and recreated since) or the checkpoint (a table deleted, emptied or rolled back) is
  refused (BadInput).
- A batch Spark recorded as committed that the tables lack (the last run ended while the store
  committed it) is read again (`replay`).
- Records the broker deleted before any run read them are said; a mirror's are refused, or
  kept in the ledger as lost under --skip-lost-offsets (`lag --sink` calls the table
  incomplete).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from lagless.exceptions import BadInput
from lagless.importer.checkpoint import (
    committed_ranges,
    last_end_offsets,
    marked_storing,
    newest_committed,
    uncommit,
    unmark_storing,
)
from lagless.importer.routing import Destination
from lagless.importer.table_lag import history_of_another_topic
from lagless.kafka import Offsets
from lagless.sinks.ledger import lacking, lacks_only, reconcile
from lagless.source import to_json_offsets
from lagless.source.data_loss import Lost

if TYPE_CHECKING:
    from lagless.importer.plan import ImportPlan
    from lagless.importer.spec import ImportSpec
    from lagless.progress import Collector

log = logging.getLogger(__name__)


def resume(plan: ImportPlan, collector: Collector, low: Offsets, high: Offsets) -> Offsets:
    """Where the run resumes: each table's ledger read (read_ledgers), what the broker deleted
    before any run read it said (or refused, for a mirror), the tables' warnings passed on;
    the offsets the checkpoint's last batch ended at returned."""
    spec = plan.spec
    read_ledgers(plan, plan.destinations, low, high)
    done = last_end_offsets(spec.checkpoint)
    gone = deleted_before_read(low, plan.held, done)
    if gone is not None:
        refuse_an_incomplete_mirror(spec, low, plan.held, done)
        collector.warn(gone)
        plan.lost += mirror_losses(spec, low, high, plan.held, done)
    for each in plan.destinations:
        if each.warning is not None:
            collector.warn(each.warning)
    return done


def deleted_before_read(low: Offsets, held: Offsets, done: Offsets) -> str | None:
    """One line when partitions no table read start above offset 0: the broker deleted their
    first records (retention; the embedded broker keeps about 5 MB a partition) before any
    import read them. None when there are none."""
    gone = {tp: o for tp, o in sorted(low.items()) if o and tp not in held and tp not in done}
    if not gone:
        return None
    named = ", ".join(f"{t}[{p}]" for t, p in list(gone)[:4]) + (", ..." if len(gone) > 4 else "")
    return (
        f"the broker deleted {sum(gone.values()):,} records of {len(gone)} partition(s) "
        f"({named}) before they were read: their logs start above offset 0 (retention)"
    )


def refuse_an_incomplete_mirror(
    spec: ImportSpec, low: Offsets, held: Offsets, done: Offsets
) -> None:
    """A mirror whose change events the broker deleted before any run read them would miss
    rows, with nothing said but a warning: refused (BadInput, each partition's count), as
    Spark's failOnDataLoss refuses offsets lost under a checkpoint, unless
    --skip-lost-offsets accepts the loss (the warning is said then). A mirror told where to
    start (--starting-timestamp: a re-snapshot's) wants nothing before it."""
    if spec.value_format != "debezium" or not spec.fail_on_data_loss:
        return
    if spec.starting_timestamp is not None:
        return
    gone = {tp: o for tp, o in sorted(low.items()) if o and tp not in held and tp not in done}
    if not gone:
        return
    counts = ", ".join(f"{t}[{p}] {o:,}" for (t, p), o in gone.items())
    raise BadInput(
        f"the broker deleted change events before the mirror read them ({counts}): the "
        "mirror would miss rows. Re-snapshot those tables through Debezium (its "
        "execute-snapshot signal) into a new --table and --checkpoint, or accept the loss "
        "with --skip-lost-offsets"
    )


def mirror_losses(
    spec: ImportSpec, low: Offsets, high: Offsets, held: Offsets, done: Offsets
) -> list[Lost]:
    """A mirror's change events the broker deleted before any run read them, accepted under
    --skip-lost-offsets: lost from offset 0, so that the table's ledger keeps their count
    (Batch.skipped) and `lag --sink` calls the table incomplete. Other imports' tables start
    where their logs start."""
    if spec.value_format != "debezium" or spec.fail_on_data_loss:
        return []
    if spec.starting_timestamp is not None:
        return []
    return [
        Lost(tp, 0, o, high[tp])
        for tp, o in sorted(low.items())
        if o and tp not in held and tp not in done
    ]


def read_ledgers(
    plan: ImportPlan,
    destinations: list[Destination],
    low: Offsets,
    high: Offsets,
) -> None:
    """Each table's ledger decides where its partitions start: a lost, fresh or lagging
    checkpoint never imports twice what the table holds (sinks/ledger.py). Read, and a ledger
    that contradicts the log or the checkpoint refused, before anything is written."""
    lost = {each.tp for each in plan.lost}
    for each in destinations:
        each.held = reconcile(plan.sink.ledger(each.target, each.partitions), low, high, each.where)
        if each.held:
            log.info(
                "%s holds %s; the import resumes after it", each.where, to_json_offsets(each.held)
            )
    mirrored = [each for each in destinations if each.stopped is None]
    checkpoint = plan.spec.checkpoint
    replayed = a_batch_the_tables_lack(checkpoint, mirrored, lost)
    # What the checkpoint's committed batches read, the batch read again left out: read once,
    # held against every table.
    committed = {
        tp: r for tp, r in committed_ranges(checkpoint, before=replayed).items() if tp not in lost
    }
    for each in mirrored:
        refuse_a_recreated_topic(plan, each, low, high)
        refuse_a_table_behind(checkpoint, each, committed)
    replay(checkpoint, replayed)


def a_batch_the_tables_lack(
    checkpoint: str, destinations: list[Destination], lost: set[tuple[str, int]]
) -> int | None:
    """The store commits a batch beside the next batch's tasks (batch_writer.py), after Spark
    recorded it as committed, and marks it in the checkpoint meanwhile: a run that ended
    between the two left tables that hold everything before that batch and not all of it.
    That batch, to be read again (`replay`, once every check passed); None when there is none.
    Without the mark, a table that lacks what the checkpoint committed is refused
    (refuse_a_table_behind)."""
    batch_id, start, end = newest_committed(checkpoint) or (-1, None, {})
    if start is None or batch_id not in marked_storing(checkpoint):
        return None
    topics = {topic for each in destinations for topic in each.topics}
    ends = {tp: offset for tp, offset in end.items() if tp[0] in topics and tp not in lost}
    held = {tp: offset for each in destinations for tp, offset in each.held.items()}
    return batch_id if lacks_only(held, start, ends) else None


def replay(checkpoint: str, batch_id: int | None) -> None:
    """Spark's record of `batch_id` removed, so that the query reads it again from its
    journaled offsets, into each table only what its ledger lacks; the marks of batches whose
    commits ended with their run cleared."""
    if batch_id is not None:
        uncommit(checkpoint, batch_id)
        log.warning(
            "the tables lack batch %d, which Spark had recorded as committed (the last run "
            "ended while the store committed it): it is read again",
            batch_id,
        )
    for marked in marked_storing(checkpoint):
        unmark_storing(checkpoint, marked)


def refuse_a_recreated_topic(
    plan: ImportPlan, destination: Destination, low: Offsets, high: Offsets
) -> None:
    """BadInput, before anything is written, when a topic the table holds was deleted and
    recreated since (ledger.recreated): its new log's offsets would be taken for those the
    table holds, and the new records below them never imported. --skip-lost-offsets does not
    change this: the table's rows are the deleted topic's, not lost offsets of this one."""
    found = history_of_another_topic(
        plan.sink, destination.target, plan.reader.records, destination.held, low, high
    )
    if found:
        raise BadInput(
            f"{destination.where} holds the history of another topic of that name: {found[0]}; "
            "the topic was deleted and recreated since. Import it into another --table (with a "
            "new --checkpoint), or drop the table to import the new topic from its start"
        )


def refuse_a_table_behind(
    checkpoint: str, destination: Destination, committed: dict[tuple[str, int], tuple[int, int]]
) -> None:
    """BadInput, before anything is written, when a table no longer holds what the
    checkpoint's committed batches read of its topics (it was deleted, emptied or rolled back
    since): the query would resume past the gap and leave it unfilled, with nothing said.
    `committed`: what the committed batches read (read_ledgers), without the partitions whose
    checkpoint offsets the log lost (a recreated topic, read again from its start under
    --skip-lost-offsets: another log's) and without a batch to be read again
    (a_batch_the_tables_lack)."""
    gap = lacking(
        destination.held, {tp: r for tp, r in committed.items() if tp[0] in destination.topics}
    )
    if gap is None:
        return
    topic, partition = gap.tp
    holds = f"only up to offset {gap.held:,}" if gap.held else "none of it"
    raise BadInput(
        f"checkpoint {checkpoint!r} imported {topic}[{partition}] up to offset {gap.end:,}, "
        f"but {destination.where} holds {holds}: the table was deleted, emptied or rolled "
        "back since; to import what it lacks, use a new --checkpoint (the table's ledger then "
        "decides where each partition resumes)"
    )
