"""The sampling loop: every interval, a look at the broker for every group (their committed
offsets and the log bounds of all their partitions, LOOK_GROUPS groups at a time), then each
group's view.

Broker calls go through one seam (`FleetSource`), shared by all groups: the clients, the file
descriptors and the requests per round do not grow with the number of groups (a partition
read by several groups is asked once). Nothing stops the loop: a failing broker, or any error
in a round, leaves each group its last view marked with the error (status UNKNOWN) until the
next round succeeds. Views are rebuilt after each round and swapped in whole, so the HTTP
threads read them without waiting on the broker. The records at committed offsets (exact time
lag), retention.ms and the groups' members are read in threads of their own: a slow answer
never delays a round.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from lagless.exceptions import LaglessError
from lagless.kafka import TP
from lagless.lag.members import GroupDescription, assigned_partitions, held_partitions
from lagless.lag.offsets import (
    FleetLook,
    FleetSource,
    PartitionSample,
    RecordInfo,
    group_samples,
    look,
    record_starts,
)
from lagless.lag.report import (
    LagReport,
    PartitionLag,
    RunHistory,
    judge_partition,
    same_offsets,
    still_phase,
)
from lagless.lag.status import Status
from lagless.serve.view import (
    GroupView,
    Sampled,
    Series,
    carry_timeless,
    group_view,
    shows_the_same,
)

log = logging.getLogger(__name__)

# retention.ms changes rarely, and a broker that does not answer DescribeConfigs makes each
# try wait for its timeout: ask again only this often.
RETENTION_CONFIG_EVERY_S = 300.0
# Groups the broker lists are looked up again this often (new groups appear).
LIST_GROUPS_EVERY_S = 30.0
# Each group's offsets are asked of every partition it committed on at least this often (a
# commit on a topic it did not read before shows within it), and of the partitions it is known
# to read in the rounds between: a broker may answer "every partition" of a group far more
# slowly (noida-db scans every group's offsets: 0.4 ms a group among 2,000).
WHOLE_EVERY_S = 30.0
# ... and at least this many groups each round, the longest asked so: up to this many groups,
# every group is asked whole every round.
WHOLE_PER_ROUND = 100
# Records read at committed offsets per read: the fleet's lagging partitions are read a part at
# a time, a topic at a time (the most lagging first); the others show an interpolated time lag
# meanwhile.
RECORDS_PER_READ = 2000
# Groups per look at the broker in a round: the next part's look overlaps the views of the one
# before (2,000 groups x 12 partitions on noida-db: the first round about 1.0 s in parts of
# 250, 1.3 s in one look; bench/fleet.py).
LOOK_GROUPS = 250


@dataclass(frozen=True)
class SamplerSettings:
    interval_s: float
    window_s: float
    retention_warning_s: float

    @property
    def keep_s(self) -> float:
        # Twice the window, so a STOP (no move for longer than the window) can be seen.
        return 2 * self.window_s + self.interval_s


class GroupWatch:
    """One group: what was learned of it so far, and its latest view.

    A partition whose offsets hold still keeps its row from round to round instead of being
    judged again, while the record at its committed offset, its topic's retention.ms, whether
    a member holds it and the phase of its status (report.still_phase: a lagging partition
    turns STALL at its second sample, STOP past the window) stay the same; a group whose rows
    are all kept, with the same status, state and members, keeps its metrics lines too. So a
    fleet of caught-up, stalled or stopped groups costs little more per round than asking the
    broker."""

    def __init__(self, group: str, settings: SamplerSettings) -> None:
        self.group = group
        self.settings = settings
        self.history = RunHistory(keep_s=settings.keep_s)
        self.description: GroupDescription | None = None
        self.members_asked = False
        """DescribeGroups was asked of the group (description is its answer)."""
        self.series = Series()
        self.sampled_at: float | None = None
        self.error: str | None = None
        self.error_since: float | None = None
        self.latest: Sequence[PartitionSample] = ()
        self.lags: dict[TP, int] = {}
        self.by_lagless = False
        self.record_starts: dict[TP, int] = {}
        """Where the records whose timestamps give the exact time lag are."""
        self.reads_changed = False
        """record_starts or lags changed since the sampler last read them (or it failed)."""
        self.partitions: Sequence[TP] | None = None
        """The partitions the group was judged on at its latest look (None: none yet)."""
        self.asked_whole_at: float | None = None
        """When the broker was last asked for every partition the group committed on."""
        self.judged = 0
        """Rows judged (not kept) by the latest build_view: for tests and the bench."""
        self._offsets_since: dict[TP, float] = {}
        """When each partition's offsets took the values of its latest sample."""
        self._kept: dict[TP, tuple[tuple[object, ...], PartitionLag]] = {}
        """The row of each still partition, with what it was judged with (still_phase)."""
        self._keys: list[TP] = []
        """The history's partitions, in order."""
        self.view = self._new_view({}, None)

    def sampled(self, samples: Sequence[PartitionSample], at: float, by_lagless: bool) -> None:
        self.by_lagless = by_lagless
        history, since = self.history, self._offsets_since
        for sample in samples:
            last = history.latest_of((sample.topic, sample.partition))
            if last is None or not same_offsets(last, sample):
                since[(sample.topic, sample.partition)] = sample.at
                # Judged again: the older samples may all be forgotten by the time the row is
                # built (after a long outage), which would leave this one sample still.
                self._kept.pop((sample.topic, sample.partition), None)
        self.history.add(samples)
        if self.error is not None:  # its records are wanted again
            self.reads_changed = True
        self.error = self.error_since = None
        self.sampled_at = at
        self.latest = samples
        lags, starts = {s.key: s.lag for s in samples}, record_starts(samples)
        self.reads_changed = self.reads_changed or (lags, starts) != (self.lags, self.record_starts)
        self.lags, self.record_starts = lags, starts

    def failed(self, error: str, asked_at: float) -> None:
        if self.error is None:
            self.error_since = asked_at  # not when the request gave up, seconds later
            self.reads_changed = True
        self.error = error

    def build_view(
        self,
        records: Mapping[tuple[TP, int], RecordInfo | None],
        retention_ms: Mapping[str, int | None] | None,
        now: float | None,
    ) -> GroupView:
        view = self._new_view(records, retention_ms)
        if shows_the_same(view, self.view):
            carry_timeless(view, self.view)
        if now is not None and view.up and view.partitions:
            self.series.append(
                now,
                view.total_lag,
                view.max_lag_seconds(now),
                {p.key: p.lag for p in view.partitions},
            )
        self.view = view
        return view

    def _new_view(
        self,
        records: Mapping[tuple[TP, int], RecordInfo | None],
        retention_ms: Mapping[str, int | None] | None,
    ) -> GroupView:
        known = {
            tp: found
            for tp, offset in self.record_starts.items()
            if (found := records.get((tp, offset))) is not None
        }
        sampled = Sampled(
            history=self.history,
            records=known,
            description=self.description,
            retention_ms=retention_ms,
            sampled_at=self.sampled_at,
            error=self.error,
            error_since=self.error_since,
            by_lagless=self.by_lagless,
        )
        return group_view(
            self.group,
            LagReport(self.group, self._rows(known, retention_ms)),
            sampled,
            self.settings.window_s,
            self.settings.retention_warning_s,
            self.series,
        )

    def _rows(
        self, records: Mapping[TP, RecordInfo], retention_ms: Mapping[str, int | None] | None
    ) -> tuple[PartitionLag, ...]:
        """build_report's rows, a still partition's kept rather than judged again."""
        window_s = self.settings.window_s
        held = held_partitions(self.description)
        history, since, kept_rows = self.history, self._offsets_since, self._kept
        if len(self._keys) != len(history):  # partitions are added to a history, never removed
            self._keys = sorted(history.keys())
        rows = []
        judged = 0
        for key in self._keys:
            latest = history.latest_of(key)
            assert latest is not None  # a key of the history
            first_at = history.first_at(key)
            record = records.get(key)
            record_at = None if record is None else record.timestamp_s
            topic_retention = None if retention_ms is None else retention_ms.get(key[0])
            owned = None if held is None else key in held
            # Every kept sample holds the latest offsets (known from when they took those
            # values). They need not be compared with the kept row's: it was dropped when they
            # moved (sampled).
            still = since[key] <= first_at
            kept = kept_rows.get(key)
            if still:
                phase = still_phase(latest, first_at, history.count(key), window_s)
                inputs = (record_at if latest.lag else None, topic_retention, owned, phase)
                if kept is not None and kept[0] == inputs:
                    rows.append(kept[1])
                    continue
            row = judge_partition(
                history.of(key), window_s, record_at, owned=owned, retention_ms=topic_retention
            )
            judged += 1
            if still:
                kept_rows[key] = (inputs, row)
            else:
                kept_rows.pop(key, None)
            rows.append(row)
        self.judged = judged
        return tuple(rows)


class Ahead:
    """`job(arg)` run in a daemon thread of its own from now on; `result()` waits for what it
    returned, or raises what it raised."""

    def __init__(self, job: Callable[[Sequence[str]], FleetLook | str], arg: Sequence[str]):
        self._outcome: list[FleetLook | str] = []
        self._error: list[BaseException] = []

        def run() -> None:
            try:
                self._outcome.append(job(arg))
            except BaseException as exc:  # raised again in the round's thread, by result()
                self._error.append(exc)

        self._thread = threading.Thread(target=run, name="lag-look", daemon=True)
        self._thread.start()

    def result(self) -> FleetLook | str:
        self._thread.join()
        if self._error:
            raise self._error[0]
        return self._outcome[0]


class Background:
    """A job run in a daemon thread of its own, one at a time: a slow broker answer holds
    the thread, never the sampling round. A job that fails is logged, and tried again when
    next asked."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._thread: threading.Thread | None = None

    def start(self, job: Callable[[], None]) -> bool:
        """Start `job` unless the previous one still runs; whether it started."""
        if self._thread is not None and self._thread.is_alive():
            return False

        def guarded() -> None:
            try:
                job()
            except Exception:
                log.warning("%s failed; tried again at a later round", self._name, exc_info=True)

        self._thread = threading.Thread(target=guarded, name=self._name, daemon=True)
        self._thread.start()
        return True

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)


class Sampler:
    """Samples every group each round; `views()` is safe to call from any thread."""

    def __init__(
        self,
        source: FleetSource,
        settings: SamplerSettings,
        groups: Sequence[str] | None = None,
        now: Callable[[], float] = time.time,
        after_round: Callable[[Sequence[GroupView]], None] = lambda views: None,
    ) -> None:
        """groups None: every group the broker lists (ListGroups). after_round: called with
        the new views after each round, in the sampling thread (serve writes their metrics
        lines there, so a scrape does not)."""
        self._after_round = after_round
        self._source = source
        self.settings = settings
        self._discover = groups is None
        self._now = now
        self._watches = {
            group: GroupWatch(group, settings) for group in dict.fromkeys(groups or [])
        }
        self._listed_at: float | None = None
        self._lock = threading.Lock()
        # (partition, offset) -> the record there; None: tried, not readable.
        self._records: dict[tuple[TP, int], RecordInfo | None] = {}
        self._records_read: dict[tuple[TP, int], RecordInfo | None] = {}  # by the thread
        self._records_lock = threading.Lock()
        # The records wanted, with the largest lag at each: None when a group's changed.
        self._wanted: dict[tuple[TP, int], int] | None = None
        self._record_reader = Background("lag-records")
        self._retention_ms: dict[str, int | None] | None = None
        self._retention_asked_at: float | None = None
        self._retention_topics: frozenset[str] = frozenset()
        self._retention_reader = Background("lag-retention")
        self._members_reader = Background("lag-members")
        self._members_read: Mapping[str, GroupDescription | None] | None = None  # by the thread
        self._members_lock = threading.Lock()
        self.rounds = 0
        self.poll_time_ms: float | None = None
        # Named groups are listed from the start, with no partitions until their first sample.
        self._views = tuple(self._watches[g].view for g in sorted(self._watches))

    def sample_once(self) -> None:
        """One round. Never raises (but for KeyboardInterrupt and the like): whatever goes
        wrong is every group's error until a round succeeds."""
        started = time.monotonic()
        asked_at = self._now()
        try:
            self._round(asked_at)
        except Exception as exc:
            log.warning("sampling round failed; the next one tries again", exc_info=True)
            error = f"sampling failed: {_one_line(exc)}"
            for watch in self._watches.values():
                watch.failed(error, asked_at)
                try:
                    watch.build_view(self._records, self._retention_ms, None)
                except Exception:  # the view itself cannot be built: its last one, marked
                    watch.view = replace(watch.view, status=Status.UNKNOWN, error=error, cache={})
        views = tuple(self._watches[g].view for g in sorted(self._watches))
        with self._lock:
            self._views = views
            self.rounds += 1
            self.poll_time_ms = (time.monotonic() - started) * 1000
        try:
            self._after_round(views)
        except Exception:
            log.warning("after a sampling round", exc_info=True)

    def _round(self, asked_at: float) -> None:
        """The groups are looked at LOOK_GROUPS at a time, the broker asked for the next part
        while this thread builds the views of the one before (overlapped: at the first round,
        when every group's offsets are asked whole, the broker's answer and judging every
        partition each take about half of it). The members are those the DescribeGroups
        asked after the round before told (_ask_members); a few groups seen for the first
        time are described with their first look."""
        if self._discover:
            self._find_groups()
        self._take_members()
        groups = list(self._watches)
        followed = {g: assigned_partitions(w.description) for g, w in self._watches.items()}
        known = self._known_partitions()
        self._take_records()
        # A few groups seen for the first time are described with their first look, so their
        # first views show their members (a group with none is STOP at once, as the doctor
        # says); a fleet's first round is not: its groups' members come with the next round.
        new = {group for group, watch in self._watches.items() if not watch.members_asked}
        describe_new = len(new) <= LOOK_GROUPS

        def part_look(part: Sequence[str]) -> FleetLook | str:
            describe = describe_new and not new.isdisjoint(part)
            try:
                return look(
                    self._source, part, followed, describe=describe, now=self._now, known=known
                )
            except LaglessError as exc:
                return _one_line(exc)

        parts = [groups[at : at + LOOK_GROUPS] for at in range(0, len(groups), LOOK_GROUPS)]
        ahead = Ahead(part_look, parts[0]) if parts else None
        found: FleetLook | str = ""
        for number, part in enumerate(parts):
            if ahead is not None:
                found, ahead = ahead.result(), None
            # A look that failed (the broker away) is every later part's too: asked, each
            # would wait for its timeout.
            if not isinstance(found, str) and number + 1 < len(parts):
                ahead = Ahead(part_look, parts[number + 1])
            self._sampled(part, found, followed, known, asked_at)
            now = self._now()
            for group in part:
                self._watches[group].build_view(self._records, self._retention_ms, now)
        if any([w.reads_changed for w in self._watches.values()]):
            self._wanted = None
            for watch in self._watches.values():
                watch.reads_changed = False
        self._read_wanted()
        self._ask_retention()
        self._ask_members()

    def _sampled(
        self,
        part: Sequence[str],
        found: FleetLook | str,
        followed: Mapping[str, Sequence[TP]],
        known: Mapping[str, Sequence[TP]],
        asked_at: float,
    ) -> None:
        """Each group of the part given its samples in `found`, or its error (found a string:
        why the look failed)."""
        for group in part:
            watch = self._watches[group]
            if isinstance(found, str):
                watch.failed(found, asked_at)
                continue
            try:
                samples = group_samples(found, group, followed[group])
                watch.sampled(samples, found.at, found.committed_by_lagless(group))
            except LaglessError as exc:
                watch.failed(_one_line(exc), asked_at)
            else:
                watch.partitions = found.partitions.get(group)
                if group not in known:
                    watch.asked_whole_at = asked_at
                if not watch.members_asked and group in found.described:
                    watch.description = found.described[group]
                    watch.members_asked = True

    def _known_partitions(self) -> dict[str, Sequence[TP]]:
        """The groups whose offsets are asked of the partitions they were judged on last round
        only: all but the few whose every committed partition is asked (a commit on a topic a
        group did not read before shows then). Those few are the groups asked so the longest
        ago, enough each round that each group is asked whole every WHOLE_EVERY_S, and at least
        WHOLE_PER_ROUND: a small fleet is asked whole every round."""
        watches = self._watches.values()
        due = max(
            WHOLE_PER_ROUND,
            math.ceil(len(self._watches) * self.settings.interval_s / WHOLE_EVERY_S),
        )
        if len(self._watches) <= due:
            return {}
        order = sorted(
            watches, key=lambda w: -1.0 if w.asked_whole_at is None else w.asked_whole_at
        )
        return {w.group: w.partitions for w in order[due:] if w.partitions and w.error is None}

    def _find_groups(self) -> None:
        """New groups the broker lists. Groups once found stay reported, even when they stop
        or empty (or are deleted: their last view stays, marked by the next failures)."""
        now = self._now()
        if self._listed_at is not None and now - self._listed_at < LIST_GROUPS_EVERY_S:
            return
        try:
            listed = self._source.list_groups()
        except LaglessError:
            return
        self._listed_at = now
        for group in listed or []:
            if group not in self._watches:
                self._watches[group] = GroupWatch(group, self.settings)

    def _read_records(self) -> None:
        self._take_records()
        self._read_wanted()

    def _take_records(self) -> None:
        """The records the background read found since, now the views'."""
        with self._records_lock:
            arrived, self._records_read = self._records_read, {}
        self._records.update(arrived)

    def _read_wanted(self) -> None:
        """The records at the committed offsets of lagging partitions, read in the
        background a part at a time, each (partition, offset) once, for all groups at it, the
        topics with the most lagging partitions first. What was read and is no longer wanted
        is forgotten."""
        reading = self._record_reader.busy()
        wanted = self._wanted
        if wanted is None:  # a group's lagging partitions changed (or it failed): asked again
            wanted = self._wanted = {}
            for watch in self._watches.values():
                if watch.error is not None:
                    continue
                for tp, offset in watch.record_starts.items():
                    wanted[(tp, offset)] = max(wanted.get((tp, offset), 0), watch.lags[tp])
            for key in self._records.keys() - wanted.keys():
                del self._records[key]
        if reading:
            return
        missing = [item for item in wanted.items() if item[0] not in self._records]
        # A topic at a time, the one with the most lagging partition first: the groups
        # reading it get their exact time lags in one round, and the others' rows are kept.
        most: dict[str, int] = {}
        for ((topic, _), _), lag in missing:
            most[topic] = max(most.get(topic, 0), lag)
        missing.sort(key=lambda item: (-most[item[0][0][0]], item[0]))
        unread: dict[TP, int] = {}
        for (tp, offset), _ in missing:
            if tp not in unread:
                unread[tp] = offset
                if len(unread) == RECORDS_PER_READ:
                    break
        if not unread:
            return

        def read() -> None:
            found = self._source.records_at(unread)
            with self._records_lock:
                for tp, offset in unread.items():
                    self._records_read[(tp, offset)] = found.get(tp)

        self._record_reader.start(read)

    def _ask_retention(self) -> None:
        """retention.ms of the topics read, in a thread of its own: a broker that does not
        answer DescribeConfigs holds the request for its timeout."""
        now = self._now()
        topics = frozenset(s.topic for w in self._watches.values() for s in w.latest if not s.gone)
        asked = self._retention_asked_at
        fresh = asked is not None and now - asked < RETENTION_CONFIG_EVERY_S
        if not topics or (fresh and topics <= self._retention_topics):
            return

        def read() -> None:
            try:
                found = self._source.retention_ms(topics)
            except LaglessError:
                found = None
            self._retention_ms = found  # one assignment: the round reads whole values only

        if self._retention_reader.start(read):
            self._retention_asked_at, self._retention_topics = now, topics

    def _ask_members(self) -> None:
        """Every group's members (DescribeGroups), asked in a thread of its own after each
        round, for the next: the broker answers while the sampler waits for its next round,
        never during one (at the first round of 2,000 groups on noida-db, describing them
        made it a quarter longer). A member may hold partitions the group never committed on:
        they are sampled from the round after, so a group without commits is judged by what
        they hold."""
        groups = list(self._watches)

        def read() -> None:
            found = self._source.describe(groups)
            with self._members_lock:
                self._members_read = found

        self._members_reader.start(read)

    def _take_members(self) -> None:
        """The members the background read found, each group's but where its sampling fails
        (the broker away: it keeps the members last told, as its last view)."""
        with self._members_lock:
            arrived, self._members_read = self._members_read, None
        for group, description in (arrived or {}).items():
            watch = self._watches.get(group)
            if watch is not None and watch.error is None:
                watch.description = description
                watch.members_asked = True

    def settle(self, timeout_s: float) -> None:
        """Wait for the background reads under way (records, retention.ms, members), then
        rebuild the views with what they found: for a one-shot sample (`lag --prometheus`)."""
        for reader in (self._record_reader, self._retention_reader, self._members_reader):
            reader.join(timeout_s)
        self._take_members()
        self._read_records()
        for watch in self._watches.values():
            watch.build_view(self._records, self._retention_ms, None)
        with self._lock:
            self._views = tuple(self._watches[g].view for g in sorted(self._watches))

    def views(self) -> tuple[GroupView, ...]:
        with self._lock:
            return self._views

    def run(self, stop: threading.Event) -> None:
        """Sample every interval until stop is set."""
        while not stop.is_set():
            started = time.monotonic()
            self.sample_once()
            stop.wait(max(0.0, self.settings.interval_s - (time.monotonic() - started)))

    def close(self) -> None:
        self._source.close()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
