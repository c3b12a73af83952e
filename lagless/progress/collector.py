"""Collectors receive what each committed batch did; the import job never prints itself."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Self

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from lagless import logs


@dataclass
class Summary:
    records: int = 0
    bytes: int = 0
    imported: int = 0
    written: int = 0
    dead_lettered: int = 0
    batches: int = 0
    seconds: float = 0.0
    by_partition: Counter[tuple[str, int]] = field(default_factory=Counter)
    dead_lettered_by_reason: Counter[str] = field(default_factory=Counter)
    # Records of batches the table held already when they were committed (another import
    # committed them meanwhile, or a replay): read, not imported again.
    already_in_table: int = 0
    # Offsets lost before they were read (deleted by retention, or a recreated topic's), skipped
    # under --skip-lost-offsets (failOnDataLoss=false).
    skipped: int = 0
    # The last batch's records and bytes (for its log line).
    last_records: int = 0
    last_bytes: int = 0
    # Where the rows land, as the summary names it: the store (an absolute path, or a URL
    # without its password) and the table; the topics imported.
    destination: str = ""
    table: str = ""
    topics: tuple[str, ...] = ()
    # What the table held when the import began: per partition, the first offset above it.
    held_before: dict[tuple[str, int], int] = field(default_factory=dict)
    # Records between where the import is and the end it reads to (bulk: the end offsets
    # seen at the start; continuous: the log's end as last seen). 0: up to date.
    behind: int = 0
    # A mirror's rows whose values it cannot know (their `_unknown` column names them: a
    # TOASTed value whose row never reached it; cdc/key_change.py), counted at the end.
    unknown_rows: int = 0

    def add_batch(
        self,
        records_by_partition: dict[tuple[str, int], int],
        bytes_read: int,
        written: int,
        dead_lettered_by_reason: dict[str, int],
        already_in_table: int = 0,
    ) -> None:
        """Records read = imported + dead-lettered + already in the table (records of table
        parts the ledger held); `written` counts the rows the tables gained or replaced."""
        self.batches += 1
        self.by_partition.update(records_by_partition)
        read = sum(records_by_partition.values())
        self.records += read
        self.bytes += bytes_read
        self.last_records = read
        self.last_bytes = bytes_read
        self.already_in_table += already_in_table
        dead = sum(dead_lettered_by_reason.values())
        self.imported += read - dead - already_in_table
        self.dead_lettered += dead
        self.written += written
        self.dead_lettered_by_reason.update(dead_lettered_by_reason)

    @property
    def up_to_date(self) -> bool:
        return self.behind == 0

    def as_dict(self) -> dict[str, object]:
        return {
            "destination": self.destination,
            "table": self.table,
            "topics": list(self.topics),
            "records": self.records,
            "bytes": self.bytes,
            "imported": self.imported,
            "written": self.written,
            "dead_lettered": self.dead_lettered,
            "dead_lettered_by_reason": dict(self.dead_lettered_by_reason),
            "already_in_table": self.already_in_table,
            "skipped": self.skipped,
            "batches": self.batches,
            "seconds": round(self.seconds, 3),
            "records_per_partition": {
                f"{t}[{p}]": n for (t, p), n in sorted(self.by_partition.items())
            },
            "held_before": {f"{t}[{p}]": n for (t, p), n in sorted(self.held_before.items())},
            "behind": self.behind,
            "up_to_date": self.up_to_date,
            "unknown_rows": self.unknown_rows,
        }


class Collector:
    """Receives the import's progress. The base class ignores everything.

    Used as a context manager around the import: `close` runs however the import ends."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """The import is over, finished or failed: release the display."""

    def warn(self, text: str) -> None:
        """Something the user should know before the import runs (one line)."""

    def start(self, lag: int) -> None:
        """The import begins with `lag` records to read (as far as is known)."""

    def batch(self, summary: Summary, lag: int) -> None:
        """A batch was committed; `summary` holds the running totals, `lag` what remains."""

    def finish(self, summary: Summary) -> None:
        """The import ended."""


# The bar's rate: over about the last this many seconds of batches.
RATE_WINDOW_S = 10.0
# Following a topic with stdout not a terminal (a supervisor's log, a file): a progress line at
# most this often, for the batches since the last one.
LINE_EVERY_S = 60.0


class RecentRate:
    """Records/s and bytes/s over the batches of about the last RATE_WINDOW_S seconds, as a
    progress bar's speed is read: how fast the import goes now. Never through the first batch
    once a later one is done: the first carries Spark's start (a fresh JVM's first tasks,
    compiled plans), which the bar's elapsed time shows, and which made a 2-batch import that
    read 26,000 records/s show 9,000. The summary's records/s is the whole run's."""

    def __init__(self, started: float) -> None:
        self._marks: list[tuple[float, int, int]] = [(started, 0, 0)]

    def add(self, at: float, records: int, size: int) -> tuple[float, float]:
        """Records and bytes done by `at`: (records/s, bytes/s)."""
        self._marks.append((at, records, size))
        first = 1 if len(self._marks) > 2 else 0  # the first batch's end, once it is not the last
        keep = first
        for index in range(first, len(self._marks) - 1):
            if self._marks[index][0] <= at - RATE_WINDOW_S:
                keep = index
        since = self._marks[keep]
        # Marks older than `since` are never needed again (but the first batch's end).
        del self._marks[first + 1 : keep]
        seconds = max(at - since[0], 1e-9)
        return (records - since[1]) / seconds, (size - since[2]) / seconds


class RichCollector(Collector):
    """On a terminal, a live bar (stderr) with records/s and MB/s (RecentRate), remaining lag
    and elapsed time; following a topic (`follow`), lines on stdout instead (`_progress_line`:
    a line per batch on a terminal, a line a minute at most elsewhere). At the end, the
    summary on stdout (`summary=False`: none, as under --json)."""

    def __init__(
        self,
        console: Console | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        summary: bool = True,
        follow: bool = False,
    ) -> None:
        self.console = console or Console(stderr=True)
        # The summary and a followed topic's lines: stdout (or the console given, the demo's).
        self.summary_console = (console or Console()) if summary else None
        self.follow = follow
        self._progress = Progress(
            TextColumn("[bold]import"),
            BarColumn(),
            TextColumn("{task.completed:,.0f}/{task.total:,.0f} records"),
            TextColumn("{task.fields[rate]}"),
            TextColumn("lag {task.fields[lag]:,}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
            # Not on a terminal (a supervisor's log): no bar, so stderr holds only what failed.
            disable=follow or not self.console.is_terminal,
        )
        self._task: TaskID | None = None
        self._clock = clock
        self._rate = RecentRate(clock())
        # Following: when the last progress line was printed, and the totals it showed.
        self._line_at: float | None = None
        self._shown = (0, 0)  # batches, records

    def warn(self, text: str) -> None:
        self.console.print(
            f"lagless: warning: {text}", highlight=False, markup=False, soft_wrap=True
        )

    def start(self, lag: int) -> None:
        self._rate = RecentRate(self._clock())
        self._progress.start()
        self._task = self._progress.add_task("import", total=max(lag, 1), rate="", lag=lag)
        if self.follow:
            self._following(lag)

    def _following(self, lag: int) -> None:
        """Following a topic: the first line says what comes, and where each batch is logged."""
        out = self.summary_console
        if out is None:
            return
        often = "a line per batch" if out.is_terminal else f"a line per {LINE_EVERY_S:g} s at most"
        where = logs.log_file()
        logged = f"; every batch in the log, {where} (pid {os.getpid()})" if where else ""
        self._line(out, f"following the topics, {lag:,} records behind: {often}{logged}")

    def batch(self, summary: Summary, lag: int) -> None:
        if self._task is None:
            return
        records, size = self._rate.add(self._clock(), summary.records, summary.bytes)
        if self.follow:
            self._progress_line(summary, lag, records)
            return
        rate = f"{records:,.0f} rec/s {size / 1e6:,.1f} MB/s"
        self._progress.update(
            self._task,
            completed=summary.records,
            total=max(summary.records + lag, 1),
            rate=rate,
            lag=lag,
        )

    def _progress_line(self, summary: Summary, lag: int, per_second: float) -> None:
        """Following a topic: on a terminal's stdout a line per batch; elsewhere the first
        batch's, then a line for the batches of the last LINE_EVERY_S at most that often. The
        first batch carries Spark's start: it gets no rate (RecentRate leaves it out after)."""
        out = self.summary_console
        if out is None:
            return
        now = self._clock()
        if not out.is_terminal and self._line_at is not None and now - self._line_at < LINE_EVERY_S:
            return
        batches = summary.batches - self._shown[0]
        records = summary.records - self._shown[1]
        what = (
            f"batch of {records:,} records"
            if batches == 1
            else f"{batches:,} batches, {records:,} records"
        )
        rate = (
            "(the first: Spark's start in it)"
            if summary.batches == 1
            else f"{per_second:,.0f} records/s"
        )
        self._line(out, f"{what}  {rate}  behind {lag:,}  imported {summary.imported:,}")
        self._line_at = now
        self._shown = (summary.batches, summary.records)

    @staticmethod
    def _line(out: Console, text: str) -> None:
        out.print(
            f"{time.strftime('%H:%M:%S')}  {text}", highlight=False, markup=False, soft_wrap=True
        )

    def close(self) -> None:
        self._progress.stop()

    def finish(self, summary: Summary) -> None:
        self._progress.stop()
        if self.summary_console is not None:
            self.summary_console.print(
                summary_text(summary), highlight=False, markup=False, soft_wrap=True
            )


# Partitions a summary names one by one; more are counted.
NAMED_PARTITIONS = 4


def summary_text(summary: Summary) -> str:
    """What an import did, for a person: where the rows went, what was imported, what the
    table held already, and whether it is up to date."""
    topics = ", ".join(summary.topics) or "the topics"
    lines = [f"lagless import: {topics} -> table {summary.table!r} of {summary.destination}"]
    seconds = max(summary.seconds, 1e-9)
    if summary.imported or summary.dead_lettered:
        lines.append(
            f"  imported        {summary.imported:,} records ({summary.bytes / 1e6:,.1f} MB) in "
            f"{summary.seconds:.1f} s, {summary.records / seconds:,.0f} records/s"
        )
        lines.append(f"  rows written    {summary.written:,}")
    else:
        lines.append("  imported        nothing new")
    if summary.dead_lettered:
        by_reason = sorted(summary.dead_lettered_by_reason.items())
        reasons = ", ".join(f"{reason} {count:,}" for reason, count in by_reason)
        lines.append(f"  dead-lettered   {summary.dead_lettered:,} ({reasons})")
    if summary.already_in_table:
        lines.append(
            f"  already held    {summary.already_in_table:,} records read (their batches were "
            "in the table already)"
        )
    if summary.skipped:
        lines.append(f"  skipped         {summary.skipped:,} (deleted before they were read)")
    lines.append(f"  held before     {held_text(summary.held_before)}")
    if summary.unknown_rows:
        lines.append(f"  unknown values  {unknown_text(summary.unknown_rows)}")
    if summary.up_to_date:
        lines.append("up to date")
    else:
        lines.append(f"behind by {summary.behind:,} records; a rerun resumes")
    return "\n".join(lines)


def unknown_text(rows: int) -> str:
    """A mirror's rows whose values it cannot know, and the remedy (docs/mirror.md)."""
    return (
        f"{rows:,} row{'' if rows == 1 else 's'} hold values the mirror cannot know (NULL, "
        "named in _unknown): re-snapshot the table through Debezium (docs/mirror.md, TOASTed "
        "values)"
    )


def held_text(held: dict[tuple[str, int], int]) -> str:
    """What a table held (`held`: per partition the first offset above it), as the highest
    offset of each partition, the first NAMED_PARTITIONS named and the others counted."""
    shown = {tp: offset for tp, offset in sorted(held.items()) if offset}
    if not shown:
        return "nothing"
    named = [
        f"{t}[{p}] up to {'offset ' if not n else ''}{o - 1:,}"
        for n, ((t, p), o) in enumerate(list(shown.items())[:NAMED_PARTITIONS])
    ]
    more = len(shown) - len(named)
    if not more:
        return ", ".join(named)
    return (
        f"{', '.join(named)} and {more} more partition{'' if more == 1 else 's'} "
        f"({sum(shown.values()):,} offsets in all)"
    )
