"""The sampling loop: every interval, each group's offsets, state and committed records.

Broker calls go through the seams (`OffsetSource`, `MembershipSource`); a failing broker
never stops the loop: the group keeps its last view, marked with the error, until the
broker answers again. Views are rebuilt after each round and swapped in whole, so the HTTP
threads read them without waiting on the broker.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, replace

from lagless.exceptions import LaglessError
from lagless.lag.members import GroupDescription, MembershipSource, assigned_partitions
from lagless.lag.offsets import OffsetSource, RecordInfo
from lagless.lag.report import History, committed_records
from lagless.serve.view import GroupView, Sampled, SeriesPoint, group_view

# retention.ms changes rarely, and a broker that does not answer DescribeConfigs makes each
# try wait for its timeout: ask again only this often.
RETENTION_CONFIG_EVERY_S = 300.0
# Groups the broker lists are looked up again this often (new groups appear).
LIST_GROUPS_EVERY_S = 30.0
SERIES_POINTS = 600


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
    """One group: its offset source and what was learned of it so far."""

    def __init__(self, group: str, source: OffsetSource, settings: SamplerSettings) -> None:
        self.group = group
        self.source = source
        self.settings = settings
        self.history = History(keep_s=settings.keep_s)
        # partition -> (committed offset, the record there), read once per offset.
        self.records: dict[tuple[str, int], tuple[int, RecordInfo]] = {}
        self.committed: dict[tuple[str, int], RecordInfo] = {}
        self.description: GroupDescription | None = None
        self.retention_ms: dict[str, int | None] | None = None
        self.retention_asked_at: float | None = None
        self.series: deque[SeriesPoint] = deque(maxlen=SERIES_POINTS)
        self.sampled_at: float | None = None
        self.error: str | None = None
        self.error_since: float | None = None
        self.view = self._build_view(None)

    def sample(self, membership: MembershipSource, now: Callable[[], float]) -> None:
        asked_at = now()
        try:
            self.history.add(self.source.sample())
        except LaglessError as exc:
            if self.error is None:
                self.error_since = asked_at  # not when the request gave up, seconds later
            self.error = _one_line(exc)
        else:
            self.error = self.error_since = None
            self.sampled_at = now()
            try:
                self.description = membership.describe(self.group)
            except LaglessError:
                self.description = None
            # A member may hold partitions the group never committed on: sampled from the next
            # round on, so a group without commits is judged by what its members hold.
            self.source.follow(assigned_partitions(self.description))
            self._read_committed_records()
            self._ask_retention(now())
        self.view = self._build_view(now())

    def _read_committed_records(self) -> None:
        # A failed read leaves the records known; the next sample asks again.
        with suppress(LaglessError):
            self.committed = committed_records(self.source, self.history, self.records)

    def _ask_retention(self, now: float) -> None:
        """retention.ms in a thread of its own: a broker that does not answer DescribeConfigs
        holds the request for its timeout, which must not delay the samples."""
        asked = self.retention_asked_at
        if asked is not None and now - asked < RETENTION_CONFIG_EVERY_S:
            return
        self.retention_asked_at = now
        threading.Thread(target=self._read_retention, name="lag-retention", daemon=True).start()

    def _read_retention(self) -> None:
        try:
            found = self.source.retention_ms()
        except LaglessError:
            found = None
        self.retention_ms = found  # one assignment: the sampler reads whole values only

    def _build_view(self, now: float | None) -> GroupView:
        sampled = Sampled(
            history=self.history,
            records=self.committed,
            description=self.description,
            retention_ms=self.retention_ms,
            sampled_at=self.sampled_at,
            error=self.error,
            error_since=self.error_since,
        )
        view = group_view(
            self.group,
            sampled,
            self.settings.window_s,
            self.settings.retention_warning_s,
            list(self.series),
        )
        if now is not None and view.up and view.partitions:
            lags = tuple((p.topic, p.partition, p.lag) for p in view.partitions)
            self.series.append(SeriesPoint(now, view.total_lag, view.max_lag_seconds(now), lags))
            view = replace(view, series=tuple(self.series))
        return view

    def close(self) -> None:
        self.source.close()


class Sampler:
    """Samples every group each round; `views()` is safe to call from any thread."""

    def __init__(
        self,
        open_source: Callable[[str], OffsetSource],
        membership: MembershipSource,
        settings: SamplerSettings,
        groups: Sequence[str] | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        """groups None: every group the broker lists (ListGroups)."""
        self._open_source = open_source
        self._membership = membership
        self.settings = settings
        self._discover = groups is None
        self._now = now
        self._watches: dict[str, GroupWatch] = {}
        self._listed_at: float | None = None
        self._lock = threading.Lock()
        self._views: tuple[GroupView, ...] = ()
        self.rounds = 0
        self.poll_time_ms: float | None = None
        try:
            for group in groups or []:
                self._watches[group] = GroupWatch(group, open_source(group), settings)
        except BaseException:
            self.close()
            raise
        # Named groups are listed from the start, with no partitions until their first sample.
        self._views = tuple(self._watches[g].view for g in sorted(self._watches))

    def _find_groups(self) -> None:
        """New groups the broker lists (a group that cannot be opened is tried again later).
        Groups once found stay reported, even when they stop or empty."""
        now = self._now()
        if self._listed_at is not None and now - self._listed_at < LIST_GROUPS_EVERY_S:
            return
        try:
            listed = self._membership.list_groups()
        except LaglessError:
            return
        self._listed_at = now
        for group in listed or []:
            if group in self._watches:
                continue
            try:
                self._watches[group] = GroupWatch(group, self._open_source(group), self.settings)
            except LaglessError:
                continue  # tried again at the next listing

    def sample_once(self) -> None:
        started = time.monotonic()
        if self._discover:
            self._find_groups()
        for watch in list(self._watches.values()):
            watch.sample(self._membership, self._now)
        with self._lock:
            self._views = tuple(self._watches[g].view for g in sorted(self._watches))
            self.rounds += 1
            self.poll_time_ms = (time.monotonic() - started) * 1000

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
        for watch in self._watches.values():
            watch.close()
        self._membership.close()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
