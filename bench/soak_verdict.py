"""bench/soak.py's verdict, apart from the run that samples it (tests/unit/test_soak_verdict.py).

Growth: each resource's samples after the warm-up, fitted by a line; its growth an hour against
the fit's value at its start may be at most GROWTH_PER_HOUR. A figure of a process the soak
restarts (a kill -9, an import that ended) is fitted per life of that process: a new process
starts small and grows back, which fitted across the restart reads as growth that is not there,
or hides growth that is. Each life has a warm-up of its own, and is judged when its samples
after it span LIFE_FIT_S; a resource none of whose lives does is judged on its longest life.
A life whose figure is present (sampled, above zero) in under half its samples after the warm-up
(a process that comes and goes, as an import's short-lived children) is not judged, and the
verdict says so.

Latency: the plain topic's records, from produced to visible in the table. A fault's window runs
from the fault's start until the import caught up with it: every record produced before the
fault ended is visible. A record whose wait overlaps a fault's window is that fault's; the
others make the 15-minute windows, whose p99 may be at most P99_GROWTH times the first
window's. Each fault is reported apart, with its worst wait and how long it took to catch up;
one that did not catch up within RECOVERY_LIMIT_S, or never did, fails the verdict.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# A check of the verdict: what it says, whether it holds, and its kind.
Check = tuple[str, bool, str]

GROWTH_PER_HOUR = 0.10
P99_GROWTH = 1.5
WINDOW_S = 900.0
# A life whose samples after its warm-up span this long is fitted on its own.
LIFE_FIT_S = 1200.0
# A fault whose import has not caught up this long after the fault ended fails the verdict.
RECOVERY_LIMIT_S = 300.0
# What a process figure is called after its service's name (`<service> <figure>`); the rest of
# a sample (tables, folders) lives on across restarts.
PROCESS_FIGURES = (
    "python MiB",
    "jvm MiB",
    "workers MiB",
    "children MiB",
    "open files",
    "threads",
)
# A sample's key for the life of a service's process (1 for the first, +1 at each restart).
LIFE = "life"
# Figures that are not resources: a level, a rate or a latency, judged otherwise (or not); the
# soak's own memory (the instrument's, not lagless's: sampled, charted, not judged); the
# machine's load (what other work took of its cores); a process's life; and the tables' data,
# which grows with what the sources write (the files that hold it are judged).
NOT_RESOURCES = ("at_s", "produced", "visible", "lag s", "cpu cores", "soak's own", "load")
GROWS_WITH_THE_DATA = "data MiB"


def fit_growth(points: Sequence[tuple[float, float]]) -> float | None:
    """The linear fit's growth per hour, against the fit's value at its first point."""
    if len(points) < 3:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return None
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    start = mean_y + slope * (xs[0] - mean_x)
    if abs(start) < 1e-9:
        return None if abs(slope) < 1e-9 else float("inf")
    return slope * 3600 / abs(start)


# --- growth, per process life ------------------------------------------------------------------


@dataclass(frozen=True)
class Life:
    """One life of a resource's process (the only one for a resource of no process): its
    number, and its samples after its warm-up, (seconds into the run, value)."""

    number: int
    points: list[tuple[float, float]]
    # The samples taken of the life after its warm-up, the figure in them or not (None: as
    # many as its points).
    samples: int | None = None

    @property
    def present(self) -> int:
        """The samples the figure is in and above zero (a child process exiting has no resident
        memory left)."""
        return sum(1 for _, value in self.points if value)

    @property
    def sparse(self) -> bool:
        """The figure is present in under half the life's samples (a process that comes and
        goes, as an import's children): a line through a few points of it is no trend."""
        return self.samples is not None and self.present * 2 < self.samples

    @property
    def span_s(self) -> float:
        return self.points[-1][0] - self.points[0][0] if self.points else 0.0


def resources(samples: Iterable[Mapping[str, float]]) -> list[str]:
    """The figures the verdict fits, by name."""
    names = {name for row in samples for name in row}
    return sorted(
        name
        for name in names
        if not any(part in name for part in NOT_RESOURCES)
        and not name.endswith((GROWS_WITH_THE_DATA, f" {LIFE}"))
    )


def process_of(name: str, services: Iterable[str]) -> str | None:
    """The service whose process `name` is a figure of (None: a table's, a folder's)."""
    for service in services:
        if any(name == f"{service} {figure}" for figure in PROCESS_FIGURES):
            return service
    return None


def lives(samples: Sequence[Mapping[str, float]], name: str, warm_s: float) -> list[Life]:
    """The resource's samples split by its process's life, each without its first `warm_s`
    (counted from the life's first sample; the first life's from the run's start)."""
    suffix = f" {LIFE}"
    services = {key.removesuffix(suffix) for row in samples for key in row if key.endswith(suffix)}
    service = process_of(name, services)
    by_life: dict[int, list[tuple[float, float]]] = {}
    taken: dict[int, list[float]] = {}  # each life's samples, the figure in them or not
    for row in samples:
        if service and f"{service} {LIFE}" not in row:
            continue  # the process was not running
        number = int(row[f"{service} {LIFE}"]) if service else 1
        taken.setdefault(number, []).append(row["at_s"])
        if name in row:
            by_life.setdefault(number, []).append((row["at_s"], row[name]))
    found = []
    for number, points in sorted(by_life.items()):
        born = 0.0 if number == min(taken) else taken[number][0]
        kept = [p for p in points if p[0] >= born + warm_s]
        after = sum(1 for at in taken[number] if born + warm_s <= at <= kept[-1][0]) if kept else 0
        found.append(Life(number, kept, after))
    return found


def judged_lives(found: Sequence[Life], fit_s: float = LIFE_FIT_S) -> list[Life]:
    """The lives long enough to fit (LIFE_FIT_S after their warm-up), or else the longest one
    that has points enough to fit at all."""
    fittable = [life for life in found if len(life.points) >= 3]
    long_enough = [life for life in fittable if life.span_s >= fit_s]
    if long_enough or not fittable:
        return long_enough
    return [max(fittable, key=lambda life: life.span_s)]


def growth_checks(
    samples: Sequence[Mapping[str, float]], warm_s: float, judge: bool = True
) -> list[Check]:
    """A check per resource: its growth an hour over each life judged, each life named with
    its span when the process had more than one; `judge` False only reports."""
    checks: list[Check] = []
    for name in resources(samples):
        found = lives(samples, name, warm_s)
        parts, worst = [], -math.inf
        for life in judged_lives(found):
            of_life = f" (life {life.number} of {len(found)})" if len(found) > 1 else ""
            if life.sparse:
                taken = f"{life.present} of {life.samples}"
                parts.append(f"judged on too few samples ({taken}){of_life}, not judged")
                continue
            rate = fit_growth(life.points)
            if rate is None:
                continue
            worst = max(worst, rate)
            start, end = life.points[0][0] / 60, life.points[-1][0] / 60
            parts.append(f"{rate * 100:+.1f}% an hour over {start:.0f}-{end:.0f} min{of_life}")
        if parts:
            ok = worst <= GROWTH_PER_HOUR or not judge
            checks.append((f"{name}: {'; '.join(parts)}", ok, "growth"))
    return checks


# --- latency, outside the faults' windows ------------------------------------------------------


class Histogram:
    """Latencies counted in bins RESOLUTION apart (a quantile within that ratio of the exact
    one): flat memory for any number of records."""

    RESOLUTION = 1.01
    SMALLEST_S = 0.001

    def __init__(self) -> None:
        self.bins: Counter[int] = Counter()
        self.count = 0

    def add(self, seconds: float) -> None:
        self.bins[self._bin(seconds)] += 1
        self.count += 1

    def quantile(self, q: float) -> float:
        """The latency of rank `q` (the one at index int(q * count) in order), as its bin's
        top; 0 for none."""
        rank, seen = min(self.count - 1, int(q * self.count)), 0
        for each in sorted(self.bins):
            seen += self.bins[each]
            if seen > rank:
                return self.SMALLEST_S * self.RESOLUTION**each
        return 0.0

    def _bin(self, seconds: float) -> int:
        if seconds <= self.SMALLEST_S:
            return 0
        return math.ceil(math.log(seconds / self.SMALLEST_S, self.RESOLUTION))


@dataclass
class FaultWindow:
    """A fault, from its start (`started`) until the plain import caught up with it
    (`recovered`: every record produced before the fault `ended` visible); times from
    time.time(). `worst_s`: the longest wait of a record in its window."""

    name: str
    started: float
    ended: float | None = None
    recovered: float | None = None
    worst_s: float = 0.0

    def holds(self, sent: float, seen: float) -> bool:
        """A record sent at `sent` and visible at `seen` waited during the window."""
        closes = math.inf if self.recovered is None else self.recovered
        return sent <= closes and seen >= self.started

    def note_caught_up(self, oldest_unseen: float | None, now: float) -> None:
        """Recovered at `now` when the oldest record produced and not yet visible (None: none)
        was produced after the fault ended."""
        if self.ended is None or self.recovered is not None:
            return
        if oldest_unseen is None or oldest_unseen > self.ended:
            self.recovered = now


def fault_of(faults: Sequence[FaultWindow], sent: float, seen: float) -> FaultWindow | None:
    """The fault whose window the record's wait overlaps (the latest such), or None."""
    for fault in reversed(faults):
        if fault.holds(sent, seen):
            return fault
    return None


def window_of(sent: float, judged_from: float) -> int | None:
    """The 15-minute window a record sent at `sent` counts in (None: sent in the warm-up)."""
    return None if sent < judged_from else int((sent - judged_from) // WINDOW_S)


def latency_checks(
    windows: Mapping[int, Histogram],
    faults: Sequence[FaultWindow],
    run_started: float,
    judge: bool = True,
) -> list[Check]:
    """The p99 of each 15-minute window outside the faults' windows (one of fewer than 20
    records, the run's last, left out) against the first's; then each fault, its worst wait
    and its catching up, which must come within RECOVERY_LIMIT_S of its end; `judge` False
    only reports."""
    checks: list[Check] = []
    p99s = [windows[w].quantile(0.99) for w in sorted(windows) if windows[w].count >= 20]
    if p99s:
        worst = max(p99s) / p99s[0] if p99s[0] > 0 else 1.0
        listed = ", ".join(f"{p:.2f}" for p in p99s)
        checks.append(
            (
                f"visible p99 per 15 min outside the faults' windows: {listed} s "
                f"(worst {worst:.2f}x the first)",
                worst <= P99_GROWTH or not judge,
                "latency",
            )
        )
    for number, fault in enumerate(faults, 1):
        at = (fault.started - run_started) / 60
        if fault.recovered is None or fault.ended is None:
            said, ok = "never caught up", False
        else:
            took = fault.recovered - fault.ended
            said, ok = f"caught up {took:.1f} s after it ended", took <= RECOVERY_LIMIT_S
        checks.append(
            (
                f"fault {number} ({fault.name}) at {at:.1f} min: {said}; the worst wait in its "
                f"window {fault.worst_s:.2f} s",
                ok or not judge,
                "fault",
            )
        )
    return checks
