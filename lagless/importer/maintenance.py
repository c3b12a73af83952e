"""Maintenance inside an import: between batches, a round of compaction (and, less often,
expiry) on the tables the import writes (sinks/maintenance.py), bounded in time so that the next
batch waits little; and `lagless maintain`'s one round, unbounded.

A round runs after a batch has committed (every table's part) and before Spark starts the next,
in the batch's thread: no commit of the import races it. Work a round leaves running beside the
batches (Iceberg's folds, `StoreMaintenance.aside`) commits in that thread too, after the first
batch that finds it ended, and when the import ends unstopped. A routed import's round covers every
table it writes, those of topics that appeared since it started included; none runs once a stop
was asked for (the import ends after the batch in flight). A kill during a round leaves the
table as a crash of its store's commit does (all or nothing); Spark replays the batch, which the
ledger skips. A round that fails is logged and tried again next time: the import's rows do not
depend on it.
"""

from __future__ import annotations

import errno
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace

from lagless.exceptions import ConcurrentMaintenance, TerminalError
from lagless.first_line import first_line
from lagless.sinks import Sink, maintenance_of
from lagless.sinks.maintenance import (
    RATIO,
    Policy,
    Round,
    StoreMaintenance,
)

log = logging.getLogger(__name__)

# A round's compaction stops starting groups after this long (a group under way finishes).
SLICE_S = 1.0
# Expiry lists the table's files: at least this often, and EXPIRIES_PER_WINDOW times per
# history window, a round of its own when the time-based one is not due: a file out of the
# window waits at most a thirtieth of it. At a sixth, a Delta upsert table (each batch rewrites
# it) kept 10 s of copies past a 60 s window: 1.1x of bench/table_health.py's bytes goal.
EXPIRE_EVERY_S = 60.0
EXPIRIES_PER_WINDOW = 30
# A window of a few seconds (tests) would otherwise expire after every batch.
FASTEST_EXPIRY_S = 1.0
# A table whose last expiry removed at least this share of its live bytes rewrites itself
# between expiries (a Delta upsert of random keys: copy-on-write MERGE rewrites every file a
# batch touches, the whole table each batch). Its copies out of the window are then expired
# after each batch that writes it: at a thirtieth of a 60 s window, a 1M-row Delta upsert
# table kept 2-3 of its 35 MB copies past the window, over bench/table_health.py's goal of
# twice the live bytes beside the window's; at the default hour, a minute's worth (~45).
CHURN_SHARE = 0.5
# A table gets a round (compaction only) once this many batches added files to it since its
# last, however soon: its lowest tier then holds RATIO files, which the round merges, so a
# reader opens at most that many batch files beside the compacted ones. At a half-second
# trigger, waiting for the time-based round let ~20 accumulate: a full read of a few-MB Delta
# table took up to 3.5x the compacted copy's (bench/table_health.py).
ROUND_AFTER_BATCHES = RATIO
# `lagless maintain`'s tries of a table other writers keep changing under it.
MAINTAIN_ATTEMPTS = 4
# How often the import's end looks whether the work left beside its batches has ended.
AWAITED_S = 0.05


class Schedule:
    """Called by the batch writer after every batch: runs a round when one is due, for every
    table every `every_s` seconds or when expiry is due (every `expire_every_s`), and for a
    table sooner once ROUND_AFTER_BATCHES batches wrote to it (compaction only), or after each
    batch that wrote to it, expiry included, while it rewrites itself (CHURN_SHARE)."""

    def __init__(
        self,
        maintenance: StoreMaintenance,
        tables: Callable[[], Iterable[str]],
        policy: Policy,
        every_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.maintenance = maintenance
        # The import's tables as they are now (a routed import gains some as topics appear);
        # each one's `_dlq`, `_tombstones` and `_moves` are maintained with it.
        self.tables = tables
        self.policy = policy
        self.every_s = every_s
        self.expire_every_s = max(
            FASTEST_EXPIRY_S, min(EXPIRE_EVERY_S, policy.keep_history_s / EXPIRIES_PER_WINDOW)
        )
        self.clock = clock
        self.last_round = clock()
        self.last_expiry = self.last_round
        # Per table, the batches that wrote to it since its last round.
        self.batches_since: Counter[str] = Counter()
        # Tables whose last expiry found them rewriting themselves (CHURN_SHARE).
        self.churning: set[str] = set()

    def between_batches(self, written: Iterable[str] = ()) -> None:
        """After a batch that wrote to the tables `written`."""
        for table in self.maintenance.finished_aside():
            settle_round(self.maintenance, table)
        written = set(written)
        self.batches_since.update(written)
        now = self.clock()
        expire = now - self.last_expiry >= self.expire_every_s
        if expire or now - self.last_round >= self.every_s:
            self._round(sorted(set(self.tables())), now, expire)
            self.last_round = self.clock()
            if expire:
                self.last_expiry = self.last_round
            self.batches_since.clear()
            return
        churned = sorted(written & self.churning)
        if churned:
            self._round(churned, now, expire=True)
        busy = sorted(
            t
            for t, n in self.batches_since.items()
            if n >= ROUND_AFTER_BATCHES and t not in self.churning
        )
        if busy:
            self._round(busy, now, expire=False)
        for table in churned + busy:
            del self.batches_since[table]

    def end(self, stopped: Callable[[], bool]) -> None:
        """The import ended unstopped: the work left beside its batches waited for and
        committed, until a stop is asked for (the work is then left: a daemon thread, its
        files in no snapshot, which expiry removes)."""
        while True:
            for table in self.maintenance.finished_aside():
                settle_round(self.maintenance, table)
            if not self.maintenance.aside_under_way() or stopped():
                return
            time.sleep(AWAITED_S)

    def _round(self, imported: list[str], now: float, expire: bool) -> None:
        for each in imported:
            rounds = [
                run_round(self.maintenance, table, self.policy, now + SLICE_S, expire)
                for table in self.maintenance.tables(each)
            ]
            if expire and None not in rounds:  # a failed round tells nothing: tried again
                self._note_churn(each, [done for done in rounds if done is not None])

    def _note_churn(self, imported: str, rounds: list[Round]) -> None:
        churned = [
            done
            for done in rounds
            if done.live_bytes and done.removed_bytes >= CHURN_SHARE * done.live_bytes
        ]
        if churned and imported not in self.churning:
            log.info(
                "maintenance: %s rewrites itself between expiries (%.1f MB removed, %.1f MB "
                "live): expired after each batch that writes it from now on",
                imported,
                churned[0].removed_bytes / 1e6,
                churned[0].live_bytes / 1e6,
            )
            self.churning.add(imported)
        elif not churned and imported in self.churning:
            log.info("maintenance: %s no longer rewrites itself: expired as usual", imported)
            self.churning.discard(imported)


def run_round(
    maintenance: StoreMaintenance,
    table: str,
    policy: Policy,
    deadline: float,
    expire: bool = True,
    raise_errors: bool = False,
) -> Round | None:
    """Compaction until `deadline` (a group started finishes), then expiry when asked; the
    round logged when it did something. A failure is logged and the round given up (None),
    unless raise_errors (`lagless maintain`)."""

    def work(done: Round) -> None:
        maintenance.compact(table, policy, deadline, done)
        if expire:
            maintenance.expire(table, policy, done)

    return _logged(table, work, raise_errors)


def settle_round(maintenance: StoreMaintenance, table: str) -> Round | None:
    """The table's work run aside committed (StoreMaintenance.settle), logged as a round."""
    return _logged(table, lambda done: maintenance.settle(table, done), raise_errors=False)


def _logged(table: str, work: Callable[[Round], None], raise_errors: bool) -> Round | None:
    """The round, logged when it did something; any error it raises (not a stop: a
    KeyboardInterrupt is no Exception) logged with its cause and the round given up (None),
    unless raise_errors."""
    started = time.monotonic()
    done = Round(table)
    try:
        work(done)
    except Exception as exc:
        if raise_errors:
            raise
        log.warning(
            "maintenance of %s failed, tried again next round: %s: %s",
            table,
            type(exc).__name__,
            first_line(exc),
        )
        log.debug("maintenance of %s failed", table, exc_info=exc)
        return None
    done.seconds = time.monotonic() - started
    if done.did_something or done.skipped:
        log.info("maintenance: %s", done.text())
    return done


def schedule_for(
    sink: Sink, run_id: str, tables: Callable[[], Iterable[str]], policy: Policy, every_s: float
) -> Schedule | None:
    """The import's schedule for its tables (run_id: its Target.run_id, so that its rerun may
    take over a lock it left); None when the store keeps its own files or maintenance is off
    (every_s 0)."""
    maintenance = maintenance_of(sink, run_id)
    if maintenance is None or every_s <= 0:
        return None
    maintenance.aside = True
    return Schedule(maintenance, tables, policy, every_s)


def maintain_once(sink_url: str, table: str | None, policy: Policy) -> list[Round]:
    """`lagless maintain`: one round, compaction unbounded in time then expiry, on `table` and
    the tables beside it, or every table of the store. BadInput for a store without
    maintenance, or no such table."""
    from lagless.exceptions import BadInput
    from lagless.sinks import sink_from_url

    policy = replace(policy, thorough=True, sets_window=False)
    with sink_from_url(sink_url) as sink:
        maintenance = maintenance_of(sink)
        if maintenance is None:
            raise BadInput(
                f"{sink.scheme} keeps its own files: maintain takes a Parquet, Delta or Iceberg "
                "store"
            )
        if table is not None:
            table = sink.table_name(table)
        tables = maintenance.tables(table)
        if not tables:
            raise BadInput(
                f"{sink.identity} holds no table {table}"
                if table
                else f"{sink.identity} holds no table"
            )
        try:
            return [_maintained(maintenance, each, policy) for each in tables]
        except OSError as exc:
            if not _disk_full(exc):
                raise
            raise TerminalError(
                f"maintenance of {sink.identity} stopped: no space left on the disk it writes "
                f"to ({first_line(exc)}); the table is as its last commit left it, the files "
                "the round wrote removed or left to expiry"
            ) from exc


def _disk_full(exc: BaseException) -> bool:
    """The error, or one it was raised from, is a full disk (ENOSPC)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _maintained(maintenance: StoreMaintenance, table: str, policy: Policy) -> Round:
    """`lagless maintain`'s round of one table, tried again while other writers change the
    table under it (ConcurrentMaintenance), up to MAINTAIN_ATTEMPTS times; then skipped, said
    in its Round (`conflicted`)."""
    for attempt in range(MAINTAIN_ATTEMPTS):
        try:
            done = run_round(maintenance, table, policy, time.monotonic() + 1e9, raise_errors=True)
        except ConcurrentMaintenance as exc:
            log.info("maintenance of %s met another writer: %s", table, first_line(exc))
            conflict = first_line(exc)
            time.sleep(0.2 * 2**attempt)
            continue
        assert done is not None
        return done
    return Round(table, skipped=f"{conflict}; maintained by a later run", conflicted=True)
