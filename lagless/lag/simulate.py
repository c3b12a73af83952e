"""How a consumer group drains a backlog, partition by partition, and how lagless's planner does.

An event-driven model: between events (a partition drains, a blocked consumer times out)
every rate is constant, so drain times are exact. Each consumer reads `rate` records per
second, shared evenly over its partitions that still hold records. Two kinds of consumer:

- fetching: a consumer whose partitions are all drained sits idle, the others go on;
- blocking (seed 000's importer, seed 002's blocking round-robin fetch): a consumer whose
  partitions are all drained blocks on them until `timeout_s`, is then dropped from the
  group, and the group rebalances its partitions over the consumers left.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from lagless.exceptions import BadInput
from lagless.planner.ranges import OffsetRange
from lagless.planner.split import plan_tasks

ASSIGNORS = ("range", "roundrobin", "sticky")
_DRAINED = 1e-3  # records; below this a partition counts as drained (float rounding)

Assignment = dict[int, tuple[int, ...]]


@dataclass(frozen=True)
class Rebalance:
    at_s: float
    assignment: Assignment  # consumer -> partitions


@dataclass(frozen=True)
class Drain:
    """One strategy's run: when the backlog is gone and the backlog over time."""

    name: str
    drain_s: float
    curve: list[tuple[float, float]]  # (seconds, records left)
    rebalances: list[Rebalance]


def ideal_drain_s(backlog: Sequence[int], consumers: int, rate: float) -> float:
    return sum(backlog) / (consumers * rate)


def assign_range(consumers: Sequence[int], partitions: int) -> Assignment:
    """Kafka's range assignor on one topic: contiguous runs, the first ones one longer."""
    share, longer = divmod(partitions, len(consumers))
    assignment: Assignment = {}
    start = 0
    for index, consumer in enumerate(consumers):
        length = share + (1 if index < longer else 0)
        assignment[consumer] = tuple(range(start, start + length))
        start += length
    return assignment


def assign_roundrobin(consumers: Sequence[int], partitions: int) -> Assignment:
    return {
        consumer: tuple(range(index, partitions, len(consumers)))
        for index, consumer in enumerate(consumers)
    }


def assign_sticky(
    consumers: Sequence[int], partitions: int, previous: Mapping[int, tuple[int, ...]]
) -> Assignment:
    """Survivors keep their partitions; orphans go to the least loaded; then balance."""
    held = {consumer: list(previous.get(consumer, ())) for consumer in consumers}
    owned = {partition for parts in held.values() for partition in parts}
    for orphan in (p for p in range(partitions) if p not in owned):
        held[min(consumers, key=lambda c: len(held[c]))].append(orphan)
    while True:
        most = max(consumers, key=lambda c: len(held[c]))
        least = min(consumers, key=lambda c: len(held[c]))
        if len(held[most]) - len(held[least]) <= 1:
            break
        held[least].append(held[most].pop())
    return {consumer: tuple(sorted(held[consumer])) for consumer in consumers}


def _assignor(name: str) -> Callable[[Sequence[int], int, Assignment], Assignment]:
    if name == "range":
        return lambda consumers, partitions, _: assign_range(consumers, partitions)
    if name == "roundrobin":
        return lambda consumers, partitions, _: assign_roundrobin(consumers, partitions)
    if name == "sticky":
        return assign_sticky
    raise ValueError(f"unknown assignor {name!r}")


def simulate_group(
    backlog: Sequence[int],
    consumers: int,
    assignor: str,
    rate: float,
    blocking_timeout_s: float | None = None,
) -> Drain:
    """A consumer group of `consumers` draining `backlog` (records per partition, in order).

    blocking_timeout_s None: fetching consumers; otherwise blocking consumers dropped after
    that long with nothing but drained partitions.
    """
    assign = _assignor(assignor)
    remaining = [float(count) for count in backlog]
    alive = list(range(consumers))
    assignment = assign(alive, len(backlog), {})
    rebalances = [Rebalance(0.0, assignment)]
    now = 0.0
    curve = [(now, sum(remaining))]
    blocked_since: dict[int, float] = {}
    while sum(remaining) > 0:
        rates: dict[int, float] = {}
        for consumer, partitions in assignment.items():
            busy = [p for p in partitions if remaining[p] > 0]
            rates.update({p: rate / len(busy) for p in busy})
            if blocking_timeout_s is not None and partitions and not busy:
                blocked_since.setdefault(consumer, now)
        drains_at = [now + remaining[p] / r for p, r in rates.items()]
        timeouts_at = [since + (blocking_timeout_s or 0.0) for since in blocked_since.values()]
        next_event = min(drains_at + timeouts_at)
        for partition, partition_rate in rates.items():
            left = remaining[partition] - partition_rate * (next_event - now)
            remaining[partition] = left if left > _DRAINED else 0.0
        now = next_event
        curve.append((now, sum(remaining)))
        if blocking_timeout_s is None:
            continue
        dropped = {c for c, since in blocked_since.items() if since + blocking_timeout_s <= now}
        if dropped and sum(remaining) > 0:
            alive = [c for c in alive if c not in dropped]
            assignment = assign(alive, len(backlog), assignment)
            rebalances.append(Rebalance(now, assignment))
            blocked_since = {}
    name = f"{assignor}, " + (
        "fetching" if blocking_timeout_s is None else f"blocking {blocking_timeout_s:g} s"
    )
    return Drain(name, now, curve, rebalances)


def simulate_planner(backlog: Sequence[int], slots: int, rate: float) -> Drain:
    """lagless: the planner's tasks on `slots` slots, each free slot taking the next task."""
    ranges = [OffsetRange("backlog", p, 0, count) for p, count in enumerate(backlog)]
    free_at = [0.0] * slots
    runs: list[tuple[float, float]] = []  # (start, end) of each task, at `rate`
    for task in plan_tasks(ranges, slots):
        start = heapq.heappop(free_at)
        end = start + task.records / rate
        runs.append((start, end))
        heapq.heappush(free_at, end)
    total = float(sum(backlog))
    times = sorted({0.0, *(t for run in runs for t in run)})
    curve = [
        (t, total - sum(rate * min(max(t - start, 0.0), end - start) for start, end in runs))
        for t in times
    ]
    return Drain("lagless planner", max(free_at, default=0.0), curve, [])


def simulate_all(
    backlog: Sequence[int], consumers: int, rate: float, timeout_s: float
) -> list[Drain]:
    """Every assignor with fetching then blocking consumers, then lagless's planner."""
    if not backlog or consumers < 1 or rate <= 0 or timeout_s < 0:
        raise BadInput("simulate needs partitions, consumers >= 1, rate > 0 and timeout >= 0")
    drains = [simulate_group(backlog, consumers, name, rate) for name in ASSIGNORS]
    drains += [simulate_group(backlog, consumers, name, rate, timeout_s) for name in ASSIGNORS]
    drains.append(simulate_planner(backlog, consumers, rate))
    return drains


def parse_counts(text: str) -> list[int]:
    """`9497160,9478898,...`: records left per partition, partition 0 first."""
    counts = []
    for item in text.split(","):
        try:
            count = int(item.strip())
        except ValueError:
            raise BadInput(f"--counts: {item.strip()!r} is not a whole number") from None
        if count < 0:
            raise BadInput(f"--counts: {count} is negative")
        counts.append(count)
    return counts


# A pasted table's cell borders: markdown's, and the box drawing of `lagless lag`'s own table.
_BARS = str.maketrans("│┃", "||")
# Lines inside a table that hold no row: markdown's |---|---:| and the box's rules.
_RULE = set("|-:= +─━┄┈┼╋╇┡┩├┤┏┓┗┛┌┐└┘┳┻┯┷╞╡╪")
NO_TABLE = (
    "lag table: found no table with 'partition' and 'lag' columns (paste what `stream.sh lag`, "
    "`lagless lag --markdown` or `lagless lag` print; or give the lags with --counts)"
)


def parse_lag_table(text: str) -> list[int]:
    """The lag column of the first lag table in `text`: a pasted `stream.sh lag`, `lagless lag
    --markdown` or `lagless lag` table, with any text around it (headings, prose, more tables).

    Partitions are taken in the order listed; the All row is skipped.
    """
    lines = text.splitlines()
    header_at = next(
        (i for i, line in enumerate(lines) if {"partition", "lag"} <= set(_cells(line) or ())),
        None,
    )
    if header_at is None:
        raise BadInput(NO_TABLE)
    header = _cells(lines[header_at]) or []
    partition_at, lag_at = header.index("partition"), header.index("lag")
    counts = []
    for line in lines[header_at + 1 :]:
        if line.strip() and set(line.strip()) <= _RULE:
            continue
        row = _cells(line)
        if row is None:  # the table ends
            break
        if row[partition_at] == "All":
            continue
        if len(row) <= max(partition_at, lag_at):
            raise BadInput(f"lag table: row {'|'.join(row)!r} has too few columns")
        lag = row[lag_at].replace(",", "")  # lagless prints thousands separated
        if not row[partition_at].rsplit(":", 1)[-1].isdigit() or not lag.isdigit():
            raise BadInput(f"lag table: row {'|'.join(row)!r} has no partition number and lag")
        counts.append(int(lag))
    if not counts:
        raise BadInput("lag table: no partition rows")
    return counts


def _cells(line: str) -> list[str] | None:
    """The cells of a table row; None for a line that is not one."""
    row = line.strip().translate(_BARS)
    if not row.startswith("|"):
        return None
    return [cell.strip() for cell in row.strip("|").split("|")]


def format_duration(seconds: float) -> str:
    """A drain time in the unit its size asks for: 0.042s, 12.3s, 4m05s, 1h02m03s."""
    if seconds < 10:
        return f"{seconds:.3g}s"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


# (unit, seconds in it): the chart's time axis, the largest unit the drain fills twice.
TIME_UNITS = (("hours", 3600.0), ("minutes", 60.0), ("seconds", 1.0))
# (unit, records in it): the chart's records axis, likewise.
RECORD_UNITS = (("millions", 1e6), ("thousands", 1e3), ("", 1.0))


def scale_for(largest: float, units: Sequence[tuple[str, float]]) -> tuple[str, float]:
    """The largest unit `largest` is at least two of (the smallest unit otherwise)."""
    for name, size in units:
        if largest >= 2 * size:
            return name, size
    return units[-1]
