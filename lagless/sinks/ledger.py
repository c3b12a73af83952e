"""The store is the ledger: which offsets of which topic partition a table holds.

Every store records, atomically with the rows of a batch, the offset ranges the batch covered
(`Batch.ranges`): an SQL table `<table>_ledger` in the batch's transaction, Delta application
transactions in the batch's commit, a manifest inside a Parquet batch's folder that appears in
the same rename as its files. A Spark checkpoint then only says where the *query* is; what the
*table* holds is read from the table, so a checkpoint that is lost, fresh, reused or behind
never doubles or skips a record.

The one rule, for every store, when a batch is committed (`verdict`):
- every range lies above what the table holds for its partition: the batch is new, commit it;
- every range lies within what the table holds: a replay (a crash after the store committed,
  before Spark did, or a second import of the same offsets): commit nothing;
- anything else (a range straddles the held offsets, or the batch mixes held and new ranges):
  another import committed these offsets meanwhile. The batch is refused with a TransientError:
  a rerun reads the table's ledger again and resumes after it. Never doubled.

At the start (`reconcile`), an import reads the ledger and starts each partition at the
highest offset the table holds; a ledger beyond the log's end (the topic was recreated, or the
table was fed from another cluster) is refused before anything is written, and so is a ledger
below what the checkpoint's committed batches covered (`lacking`: the table was deleted,
emptied or rolled back under the checkpoint, which would otherwise resume past its gap).
A topic deleted and recreated under the same name whose new log is as long or longer is told
apart by the rows themselves (`recreated`): the newest row the table holds of each partition
carries its record's offset, timestamp and key, atomically with the ranges, in every store
(tables an earlier lagless wrote too); the log's record at that offset now must be the same.

Pure: no store, no broker. Offsets are (topic, partition) -> offset, ranges [start, end).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from lagless.exceptions import BadInput, ConcurrentImport
from lagless.partitions import TP

Range = tuple[int, int]


@dataclass(frozen=True)
class Batch:
    """One micro-batch as a store commits it: Spark's id (for names of staging folders only:
    ids start again at 0 with every checkpoint) and the offsets it covers.

    An upsert's batch also carries each partition's log time at its end (upsert_order.py),
    which the store keeps with the ranges. It is known once the batch's rows are staged: the
    importer fills `log_times` in the store's before_commit call, before the commit reads it."""

    id: int
    ranges: Mapping[TP, Range] = field(default_factory=dict)
    log_times: dict[TP, int] = field(default_factory=dict, compare=False)
    # Per partition, the records of its range the table never takes: the broker deleted them
    # before they were read, and the import goes on past them (--skip-lost-offsets). The
    # store keeps the count with the ranges (Sink.skipped); the table is incomplete from then.
    skipped: dict[TP, int] = field(default_factory=dict, compare=False)

    def part(self, ranges: Mapping[TP, Range]) -> Batch:
        """The batch's part of `ranges` (a table's), with their partitions' skipped records."""
        kept = {tp: n for tp, n in self.skipped.items() if tp in ranges}
        return Batch(self.id, ranges, skipped=kept)

    @property
    def covered(self) -> dict[TP, Range]:
        """The ranges that hold offsets (an empty range says nothing)."""
        return {tp: r for tp, r in sorted(self.ranges.items()) if r[1] > r[0]}

    def digest(self) -> str:
        """A name for exactly these ranges: a replay of them gets the same name."""
        text = json.dumps([[t, p, s, e] for (t, p), (s, e) in self.covered.items()])
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def to_json(self) -> str:
        """The ranges (with the records each skipped, where any), as stores keep them."""
        listed = []
        for (t, p), (s, e) in self.covered.items():
            entry: dict[str, object] = {"topic": t, "partition": p, "start": s, "end": e}
            if self.skipped.get((t, p)):
                entry["skipped"] = self.skipped[(t, p)]
            listed.append(entry)
        return json.dumps({"ranges": listed})

    @staticmethod
    def ranges_from_json(text: str) -> dict[TP, Range]:
        doc = json.loads(text)
        return {
            (r["topic"], int(r["partition"])): (int(r["start"]), int(r["end"]))
            for r in doc["ranges"]
        }


def skipped_listed(doc: Mapping[str, object]) -> dict[TP, int]:
    """The records skipped per partition in a document of Batch.to_json's shape."""
    found: dict[TP, int] = {}
    for entry in doc.get("ranges", ()):  # type: ignore[attr-defined]
        if entry.get("skipped"):
            tp = (entry["topic"], int(entry["partition"]))
            found[tp] = found.get(tp, 0) + int(entry["skipped"])
    return found


def batch_ranges(
    start: Mapping[TP, int], end: Mapping[TP, int], held: Mapping[TP, int]
) -> dict[TP, Range]:
    """The offsets a batch covers: from its start (Spark's previous end, or the query's first
    offsets; 0 for a partition new since, a new topic's, as the source reads it), raised to
    what the table held when the import began (the source reads nothing below it), to its
    end."""
    ranges = {}
    for tp, until in end.items():
        begin = start.get(tp, 0)
        if begin > until:  # the source found its start lost and read the log from its start
            begin = 0
        begin = max(begin, held.get(tp, 0))
        ranges[tp] = (min(begin, until), until)
    return ranges


class Verdict(Enum):
    NEW = "new"
    REPLAY = "replay"


def held_until(ranges: Iterable[tuple[TP, Range]]) -> dict[TP, int]:
    """The first offset above everything held, per partition."""
    until: dict[TP, int] = {}
    for tp, (_, end) in ranges:
        until[tp] = max(until.get(tp, 0), end)
    return until


def verdict(batch: Batch, held: Mapping[TP, int]) -> Verdict:
    """What a store does with `batch`, given the first offset above what it holds per
    partition (the rule in the module's docstring). Raises ConcurrentImport."""
    states = set()
    for tp, (start, end) in batch.covered.items():
        top = held.get(tp)
        if top is None or start >= top:
            states.add(Verdict.NEW)
        elif end <= top:
            states.add(Verdict.REPLAY)
        else:
            raise ConcurrentImport(
                f"{tp[0]}[{tp[1]}]: the table already holds offsets up to {top}, inside this "
                f"batch's {start}..{end}: another import wrote them meanwhile; rerun to resume "
                "after what the table holds"
            )
    if len(states) > 1:
        raise ConcurrentImport(
            "part of this batch is in the table already: another import wrote it meanwhile; "
            "rerun to resume after what the table holds"
        )
    return states.pop() if states else Verdict.REPLAY


def holds(batch: Batch, held: Mapping[TP, int]) -> bool:
    """Whether the table holds every offset of `batch` already (verdict's REPLAY), for a
    store whose unique key keeps a replay out by itself and only counts what it wrote."""
    return all(tp in held and end <= held[tp] for tp, (_, end) in batch.covered.items())


@dataclass(frozen=True)
class Lacking:
    """A partition the checkpoint's committed batches covered up to `end` that the table
    holds only up to `held` (0: nothing)."""

    tp: TP
    end: int
    held: int


def lacking(held: Mapping[TP, int], committed: Mapping[TP, Range]) -> Lacking | None:
    """The first partition (in order) of `committed` (per partition, the offsets the
    checkpoint's committed batches read: from the start of the oldest batch known to the end
    of the newest) whose offsets the table does not hold to their end; None when it holds
    them all. A partition the batches read nothing of says nothing."""
    for tp, (start, end) in sorted(committed.items()):
        if end > start and held.get(tp, 0) < end:
            return Lacking(tp, end, held.get(tp, 0))
    return None


def lacks_only(held: Mapping[TP, int], start: Mapping[TP, int], end: Mapping[TP, int]) -> bool:
    """Whether the tables hold every offset below a batch (from `start` to `end` per
    partition; a partition missing from `start` from 0) and not all of the batch's."""
    lacks = False
    for tp, until in end.items():
        since = start.get(tp, 0)
        if until <= since:
            continue
        top = held.get(tp, 0)
        if top < since:
            return False
        lacks = lacks or top < until
    return lacks


@dataclass(frozen=True)
class HeldRecord:
    """A record as a table row keeps it and as the log has it: what tells one topic's record
    at an offset from another's (Kafka brokers here give no topic id: noida-db's and the
    embedded broker's are all zeros or not answered)."""

    offset: int
    timestamp: int | None  # milliseconds since the epoch
    key: bytes | None


@dataclass(frozen=True)
class Recreated:
    """A partition whose log holds, at the offset of the newest row the table has of it,
    another record than the one imported: `held` as the table keeps it, `found` in the log."""

    tp: TP
    held: HeldRecord
    found: HeldRecord

    def __str__(self) -> str:
        topic, partition = self.tp
        differs = "timestamp" if self.held.timestamp != self.found.timestamp else "key"
        return (
            f"{topic}[{partition}]: the record at offset {self.held.offset:,} has another "
            f"{differs} than the one the table holds ({_shown(self.held, differs)}, now "
            f"{_shown(self.found, differs)})"
        )


def _shown(record: HeldRecord, what: str) -> str:
    if what == "timestamp":
        return str(record.timestamp)
    return "no key" if record.key is None else repr(record.key[:32])


def recreated(held: Mapping[TP, HeldRecord], found: Mapping[TP, HeldRecord]) -> list[Recreated]:
    """The partitions (in order) whose newest held row (`held`) differs from the log's record
    at its offset (`found`: the log's first record at or after it); none when every partition
    matches or cannot tell. A record the log no longer has at that offset (retention,
    compaction, DeleteRecords) tells nothing: only a record at the same offset with another
    timestamp or key is another topic's."""
    differ = []
    for tp, mine in sorted(held.items()):
        theirs = found.get(tp)
        if theirs is None or theirs.offset != mine.offset:
            continue
        if (theirs.timestamp, theirs.key) != (mine.timestamp, mine.key):
            differ.append(Recreated(tp, mine, theirs))
    return differ


def reconcile(
    held: Mapping[TP, int], low: Mapping[TP, int], high: Mapping[TP, int], where: str
) -> dict[TP, int]:
    """The offsets an import starts from, given what the table holds: never below it. A held
    offset beyond the log's end contradicts the log (the topic was recreated, or the table
    was filled from another cluster): BadInput, before anything is written."""
    for tp, top in sorted(held.items()):
        if tp in high and top > high[tp]:
            raise BadInput(
                f"{where} holds {tp[0]}[{tp[1]}] up to offset {top:,}, but the log ends at "
                f"{high[tp]:,}: the topic was recreated or is another cluster's; import it into "
                "another --table"
            )
    return {tp: top for tp, top in held.items() if tp in high}
