"""A group's lag, partition by partition, from the samples taken so far: the one model of a
partition's lag that `lag`, `doctor` and `serve` show."""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from lagless.lag.members import GroupDescription, held_partitions
from lagless.lag.offsets import OffsetSource, PartitionSample, RecordInfo
from lagless.lag.retention import RetentionRisk, retention_risk
from lagless.lag.status import Status, group_status, partition_status
from lagless.lag.timelag import interpolated_lag_seconds


@dataclass
class History:
    """Samples per partition, oldest first, forgetting those older than keep_s."""

    keep_s: float
    samples: dict[tuple[str, int], list[PartitionSample]] = field(default_factory=dict)

    def add(self, samples: Iterable[PartitionSample]) -> None:
        for sample in samples:
            kept = self.samples.setdefault(sample.key, [])
            kept.append(sample)
            while sample.at - kept[0].at > self.keep_s:
                kept.pop(0)

    def latest(self) -> list[PartitionSample]:
        return [self.samples[key][-1] for key in sorted(self.samples)]

    def of(self, key: tuple[str, int]) -> list[PartitionSample]:
        return list(self.samples[key])


def same_offsets(a: PartitionSample, b: PartitionSample) -> bool:
    return a.committed == b.committed and a.low == b.low and a.end == b.end and a.gone == b.gone


class RunHistory:
    """History's samples (the same, made when asked: `of`, `samples`), kept as runs of the
    same offsets: the first sample of each run and the time of every sample (8 bytes), not an
    object per sample. Serve keeps a minute of samples of every partition of a fleet, most of
    them the offsets of the one before: at 2,000 groups x 12 partitions, ~75 MB as objects."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._runs: dict[tuple[str, int], list[PartitionSample]] = {}
        self._lengths: dict[tuple[str, int], list[int]] = {}
        """The samples in each run."""
        self._times: dict[tuple[str, int], array[float]] = {}
        self._latest: dict[tuple[str, int], PartitionSample] = {}

    def add(self, samples: Iterable[PartitionSample]) -> None:
        for sample in samples:
            key = (sample.topic, sample.partition)
            runs = self._runs.get(key)
            self._latest[key] = sample
            if runs is None:
                self._runs[key], self._lengths[key] = [sample], [1]
                self._times[key] = array("d", [sample.at])
                continue
            lengths, times = self._lengths[key], self._times[key]
            if same_offsets(runs[-1], sample):
                lengths[-1] += 1
            else:
                runs.append(sample)
                lengths.append(1)
            times.append(sample.at)
            while sample.at - times[0] > self.keep_s:  # forgotten, as History forgets
                del times[0]
                lengths[0] -= 1
                if not lengths[0]:
                    del runs[0], lengths[0]

    def __len__(self) -> int:
        return len(self._runs)

    def keys(self) -> Iterable[tuple[str, int]]:
        return self._runs.keys()

    def latest_of(self, key: tuple[str, int]) -> PartitionSample | None:
        return self._latest.get(key)

    def first_at(self, key: tuple[str, int]) -> float:
        return self._times[key][0]

    def count(self, key: tuple[str, int]) -> int:
        return len(self._times[key])

    def of(self, key: tuple[str, int]) -> list[PartitionSample]:
        times = iter(self._times[key])
        made = []
        for run, length in zip(self._runs[key], self._lengths[key], strict=True):
            for _ in range(length):
                at = next(times)
                made.append(
                    run
                    if run.at == at
                    else PartitionSample(
                        run.topic, run.partition, at, run.committed, run.low, run.end, run.gone
                    )
                )
        return made

    @property
    def samples(self) -> dict[tuple[str, int], list[PartitionSample]]:
        return {key: self.of(key) for key in self._runs}


EXACT = "exact"
INTERPOLATED = "interpolated"


@dataclass(slots=True)
class PartitionLag:
    """One partition of a group as its latest sample shows it: what `lag`, `doctor` and `serve`
    all show. The time lag is computed when it is read (`lag_seconds(now)`), not when it was
    sampled: a stopped group's lag keeps growing between samples, as the truth does. Never
    changed once made (not frozen only for speed, as PartitionSample: serve judges every
    partition of a fleet in its first rounds, and a frozen one took five times as long to
    make, a sixth of judging a partition)."""

    topic: str
    partition: int
    committed: int | None
    log_start: int
    end: int
    lag: int
    status: Status
    sampled_at: float
    committed_record_at: float | None
    """Timestamp of the record at the committed offset (the oldest one not read)."""
    interpolated_age_s: float | None
    """The committed offset's age at sampled_at, interpolated from end offsets over time."""
    retention: RetentionRisk | None = None
    gone: bool = False
    """The topic (or this partition) no longer exists."""

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    def lag_seconds(self, now: float) -> tuple[float | None, str | None]:
        """(seconds, method): exact from the committed record's timestamp, else interpolated
        (labelled so), else (None, None). A caught-up partition is 0 s behind, exactly."""
        if self.lag == 0:
            return 0.0, EXACT
        if self.committed_record_at is not None:
            return max(0.0, now - self.committed_record_at), EXACT
        if self.interpolated_age_s is not None:
            return self.interpolated_age_s + max(0.0, now - self.sampled_at), INTERPOLATED
        return None, None

    def as_json(self, now: float) -> dict[str, object]:
        seconds, method = self.lag_seconds(now)
        return {
            "topic": self.topic,
            "partition": self.partition,
            "committed": self.committed,
            "log_start": self.log_start,
            "end": self.end,
            "lag": self.lag,
            "lag_seconds": None if seconds is None else round(seconds, 3),
            "lag_seconds_method": method,
            "status": self.status.name,
        }


@dataclass(frozen=True)
class LagReport:
    group: str
    rows: tuple[PartitionLag, ...]

    @property
    def total_lag(self) -> int:
        return sum(row.lag for row in self.rows)

    @property
    def max_lag(self) -> int:
        return max((row.lag for row in self.rows), default=0)

    @property
    def status(self) -> Status:
        return group_status(row.status for row in self.rows)

    def max_lag_seconds(self, now: float) -> float | None:
        known = [s for s, _ in (row.lag_seconds(now) for row in self.rows) if s is not None]
        return max(known, default=None)

    def as_json(self, now: float) -> dict[str, object]:
        return {
            "group": self.group,
            "total_lag": self.total_lag,
            "status": self.status.name,
            "partitions": [row.as_json(now) for row in self.rows],
        }


def build_report(
    group: str,
    history: History,
    window_s: float,
    records: Mapping[tuple[str, int], RecordInfo] | None = None,
    description: GroupDescription | None = None,
    retention_ms: Mapping[str, int | None] | None = None,
) -> LagReport:
    """The latest sample of each partition with its status (from the samples, and from who
    holds the partition where the broker tells), time lag and retention risk."""
    held = held_partitions(description)
    rows = []
    for key in sorted(history.samples):
        samples = history.samples[key]
        record = (records or {}).get(key)
        rows.append(
            judge_partition(
                samples,
                window_s,
                None if record is None else record.timestamp_s,
                owned=None if held is None else key in held,
                retention_ms=None if retention_ms is None else retention_ms.get(key[0]),
            )
        )
    return LagReport(group=group, rows=tuple(rows))


def judge_partition(
    samples: Sequence[PartitionSample],
    window_s: float,
    record_at: float | None,
    owned: bool | None,
    retention_ms: int | None,
) -> PartitionLag:
    """One partition's row from its samples, oldest first: its status, time lag and retention
    risk. record_at: the timestamp of the record at the committed offset, where read."""
    latest = samples[-1]
    record_at = None if latest.lag == 0 else record_at
    return PartitionLag(
        topic=latest.topic,
        partition=latest.partition,
        committed=latest.committed,
        log_start=latest.low,
        end=latest.end,
        lag=latest.lag,
        status=partition_status(samples, window_s, owned=owned),
        sampled_at=latest.at,
        committed_record_at=record_at,
        # Only where the exact time is unknown: serve builds this for every partition
        # of every group each round.
        interpolated_age_s=None if record_at is not None else interpolated_lag_seconds(samples),
        retention=retention_risk(samples, retention_ms=retention_ms, committed_record_at=record_at),
        gone=latest.gone,
    )


def still_phase(latest: PartitionSample, first_at: float, count: int, window_s: float) -> object:
    """For `count` samples from first_at to `latest` that all hold the same offsets (committed,
    log start, end, gone): what else their row depends on, but for the record at the
    committed offset, whether a member holds the partition and retention.ms. Two such runs
    with the same offsets and phase give the same row (only its sampled_at and its
    retention's as_of move): a caught-up partition is OK whatever the time; a lagging one is
    OK on one sample, STALL on more within the window (STOP where no member holds it), STOP
    past it; LOST, AHEAD and GONE need the latest sample only; nothing moved to interpolate a
    time lag with, and the log start has no rate. Serve keeps such a row instead of judging
    it again until the phase turns, so a stalled fleet costs a round little more than asking
    the broker."""
    if latest.lag == 0:
        return "caught up"
    return (count >= 2, latest.at - first_at > window_s)


def watched_span(history: History, window_s: float) -> float:
    """The window a one-shot look (`lag`, `doctor`) judges over: what it watched, which its
    request times make a little longer than asked. So over the same asked window the two
    agree, and a partition that did not move while watched is STALL, never STOP (that needs a
    longer history than the window: serve's, or `lag --watch`'s)."""
    spans = [samples[-1].at - samples[0].at for samples in history.samples.values() if samples]
    return max([window_s, *spans])


def collect(
    source: OffsetSource,
    history: History,
    seconds: float,
    interval_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Sample now and then every interval_s until `seconds` have passed."""
    history.add(source.sample())
    for _ in range(round(seconds / interval_s) if interval_s > 0 else 0):
        sleep(interval_s)
        history.add(source.sample())


def committed_records(
    source: OffsetSource,
    history: History,
    cache: dict[tuple[str, int], tuple[int, RecordInfo]] | None = None,
) -> dict[tuple[str, int], RecordInfo]:
    """The record at the committed offset of each lagging partition, for an exact time lag.

    cache (partition -> (offset, record)) keeps what was read, so a record is read once per
    committed offset however often the caller samples; records before the log start are gone
    and not asked for (the read would only wait for its timeout).
    """
    known = {} if cache is None else cache
    lagging = {key: samples[-1] for key, samples in history.samples.items() if samples[-1].lag > 0}
    offsets = {key: sample.end - sample.lag for key, sample in lagging.items()}
    unread = [
        sample
        for key, sample in lagging.items()
        if offsets[key] >= sample.low and known.get(key, (None,))[0] != offsets[key]
    ]
    if unread:
        for key, record in source.record_at(unread).items():
            known[key] = (offsets[key], record)
    for key in [key for key in known if key not in lagging]:
        del known[key]
    return {key: known[key][1] for key in lagging if key in known and known[key][0] == offsets[key]}
