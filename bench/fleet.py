"""`lagless serve` at fleet scale on noida-db: 2,000 consumer groups x 12 partitions by default.

Makes the fleet on a fresh noida-db (tests/harness/fleet.py: topics, a few records in each
partition, each group's commits, some partitions caught up and others lagging), then starts
`lagless serve` as a user does (every group the broker lists, the default 2 s interval and
30 s window) twice in the same run: first with a tenth of the groups made, then with all of
them, so the figures that must not grow with the group count are printed as same-run ratios.
For each run, over --seconds:

- launch -> listening, and listening -> every group on /metrics (`lagless_consumergroup_up`
  1), in sampling intervals (goal: within two);
- the sampling round (`kafka_consumergroup_poll_time_ms`, each round seen) p50/p99/max, and
  the CPU seconds per round of the serve process, of its child and of noida-db (the round's
  cost whatever the machine's load: on a loaded machine the round mostly waits for noida-db);
- a /metrics scrape's and an /api/groups answer's time p50/p99 (a scrape every 0.5 s);
- resident memory (sampled VmRSS, and VmHWM) of the serve process and of its child (the
  process that asks the group coordinators), and the file descriptors it holds.

With --baseline DIR, `lagless serve` from another checkout (say ../lagless-before, made by
`git worktree add ../lagless-before main`: the code before a change) runs last on the same
fleet: its figures beside, and this code's as a same-run ratio of them (the machine's load is
shared alike). CPU-seconds per round are each process's (serve,
its child, noida-db) and their sum: what a round costs whatever the load.

    .venv/bin/python bench/fleet.py [--groups 2000] [--partitions 12] [--groups-per-topic 1]
        [--baseline ../lagless-before]
    small: --groups 100 --partitions 2 --seconds 8
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from benchlib import cpu_seconds, memory_kib, tree_cpu_seconds
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.harness.fleet import make_fleet  # noqa: E402
from tests.harness.noida import NoidaKafka  # noqa: E402
from tests.harness.serve import children, descriptors, parse_metrics  # noqa: E402

INTERVAL_S = 2.0
SCRAPE_EVERY_S = 0.5
GOALS = {"round_p99_s": 1.0, "scrape_p99_s": 1.0, "rss_mib": 300, "descriptors": 200}
console = Console(stderr=True)


@dataclass
class Run:
    groups: int
    listening_s: float = 0.0
    all_on_metrics_s: float | None = None
    rounds_ms: list[float] = field(default_factory=list)
    scrapes_s: list[float] = field(default_factory=list)
    api_s: list[float] = field(default_factory=list)
    rss_kib: list[int] = field(default_factory=list)
    hwm_kib: int = 0
    child_hwm_kib: int = 0
    descriptors: list[int] = field(default_factory=list)
    cpu_s: float = 0.0
    child_cpu_s: float = 0.0
    broker_cpu_s: float = 0.0
    rounds: int = 0

    def figures(self) -> dict[str, float | int | None]:
        def p(values: list[float], q: float) -> float | None:
            if not values:
                return None
            ordered = sorted(values)
            return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

        round_p99 = p(self.rounds_ms, 0.99)
        return {
            "groups": self.groups,
            "listening_s": round(self.listening_s, 2),
            "all_on_metrics_s": None
            if self.all_on_metrics_s is None
            else round(self.all_on_metrics_s, 2),
            "all_on_metrics_intervals": None
            if self.all_on_metrics_s is None
            else round(self.all_on_metrics_s / INTERVAL_S, 2),
            "rounds": len(self.rounds_ms),
            "round_p50_s": None
            if not self.rounds_ms
            else round(statistics.median(self.rounds_ms) / 1000, 3),
            "round_p99_s": None if round_p99 is None else round(round_p99 / 1000, 3),
            "round_max_s": None if not self.rounds_ms else round(max(self.rounds_ms) / 1000, 3),
            "cpu_s_per_round": round(self.cpu_s / self.rounds, 3) if self.rounds else None,
            "child_cpu_s_per_round": round(self.child_cpu_s / self.rounds, 3)
            if self.rounds
            else None,
            "broker_cpu_s_per_round": round(self.broker_cpu_s / self.rounds, 3)
            if self.rounds
            else None,
            "all_cpu_s_per_round": round(
                (self.cpu_s + self.child_cpu_s + self.broker_cpu_s) / self.rounds, 3
            )
            if self.rounds
            else None,
            "scrape_p50_s": None
            if not self.scrapes_s
            else round(statistics.median(self.scrapes_s), 3),
            "scrape_p99_s": None if not self.scrapes_s else round(p(self.scrapes_s, 0.99) or 0, 3),
            "api_groups_p99_s": None if not self.api_s else round(p(self.api_s, 0.99) or 0, 3),
            "rss_mib": round(max(self.rss_kib, default=0) / 1024, 1),
            "hwm_mib": round(self.hwm_kib / 1024, 1),
            "child_hwm_mib": round(self.child_hwm_kib / 1024, 1),
            "descriptors": max(self.descriptors, default=0),
        }


def timed_get(url: str) -> tuple[float, str]:
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read().decode()
    return time.monotonic() - started, body


def measure(
    bootstrap: str,
    groups: list[str],
    seconds: float,
    broker_pid: int | None,
    code: Path = ROOT,
) -> Run:
    """`lagless serve` (every group listed) for `seconds` after every one of `groups` is on
    /metrics (or after seconds, if they never are); `code`: the checkout it runs from."""
    run = Run(len(groups))
    launched = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "lagless", "serve", "--bootstrap", bootstrap, "--port", "0",
         "--interval", str(INTERVAL_S)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=code,
        env={**os.environ, "PYTHONPATH": str(code)},
    )  # fmt: skip
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://"), f"lagless serve did not start: {url!r}"
        listening = time.monotonic()
        run.listening_s = listening - launched
        wanted = set(groups)
        stop, measuring = threading.Event(), threading.Event()
        child_cpu: dict[int, tuple[float, float]] = {}

        def watch_memory() -> None:
            while not stop.wait(0.2):
                found = memory_kib(process.pid)
                if found:
                    run.rss_kib.append(found[0])
                    run.hwm_kib = max(run.hwm_kib, found[1])
                for child in children(process.pid):
                    found = memory_kib(child)
                    if found:
                        run.child_hwm_kib = max(run.child_hwm_kib, found[1])
                    if measuring.is_set():  # each child's CPU from when first seen measuring
                        with contextlib.suppress(OSError):
                            used = cpu_seconds(child)
                            child_cpu[child] = (child_cpu.get(child, (used, used))[0], used)
                with contextlib.suppress(OSError):
                    run.descriptors.append(descriptors(process.pid))

        watcher = threading.Thread(target=watch_memory, daemon=True)
        watcher.start()
        cpu_before, last_poll, broker_before = None, None, 0.0
        deadline = listening + seconds + 30
        measured_until = None
        while time.monotonic() < (measured_until or deadline):
            took, text = timed_get(url + "/metrics")
            samples = parse_metrics(text)
            up = {
                dict(labels)["group"]
                for (name, labels), value in samples.items()
                if name == "lagless_consumergroup_up" and value == 1
            }
            if run.all_on_metrics_s is None and wanted <= up:
                run.all_on_metrics_s = time.monotonic() - listening
                measured_until = time.monotonic() + seconds
                cpu_before = cpu_seconds(process.pid)
                broker_before = tree_cpu_seconds(broker_pid)
                measuring.set()
            if run.all_on_metrics_s is not None:
                run.scrapes_s.append(took)
                run.api_s.append(timed_get(url + "/api/groups")[0])
                poll = next(
                    (
                        v
                        for (name, _), v in samples.items()
                        if name == "kafka_consumergroup_poll_time_ms"
                    ),
                    None,
                )
                if poll is not None and poll != last_poll:
                    run.rounds_ms.append(poll)
                    last_poll = poll
            time.sleep(SCRAPE_EVERY_S)
        if cpu_before is not None:
            run.cpu_s = cpu_seconds(process.pid) - cpu_before
            run.broker_cpu_s = tree_cpu_seconds(broker_pid) - broker_before
            run.child_cpu_s = sum(last - first for first, last in child_cpu.values())
            # A round starts every interval, or when the last one ended if it took longer.
            mean_round_s = statistics.mean(run.rounds_ms) / 1000 if run.rounds_ms else INTERVAL_S
            run.rounds = max(1, round(seconds / max(INTERVAL_S, mean_round_s)))
        stop.set()
    finally:
        process.terminate()
        process.wait(timeout=30)
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=2000)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--groups-per-topic", type=int, default=1)
    parser.add_argument("--records", type=int, default=4, help="records per partition")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured per run")
    parser.add_argument("--bootstrap", help="a noida-db already running (default: a fresh one)")
    parser.add_argument(
        "--baseline", type=Path, help="another checkout whose serve runs on the same fleet too"
    )
    args = parser.parse_args()
    console.print(f"load average before: {os.getloadavg()}")
    server = None if args.bootstrap else NoidaKafka.start_new()
    bootstrap = args.bootstrap or server.bootstrap  # type: ignore[union-attr]
    try:
        small = max(1, args.groups // 10)
        started = time.monotonic()
        first = make_fleet(
            bootstrap, "bench-a", small, args.partitions, args.groups_per_topic, args.records
        )
        console.print(f"{small} groups made in {time.monotonic() - started:.1f} s")
        broker_pid = None if server is None else server.process.pid
        runs = [measure(bootstrap, first.groups, args.seconds, broker_pid)]
        started = time.monotonic()
        rest = make_fleet(
            bootstrap, "bench-b", args.groups - small, args.partitions, args.groups_per_topic,
            args.records,
        )  # fmt: skip
        console.print(f"{args.groups - small} more made in {time.monotonic() - started:.1f} s")
        everyone = first.groups + rest.groups
        runs.append(measure(bootstrap, everyone, args.seconds, broker_pid))
        if args.baseline:
            runs.append(measure(bootstrap, everyone, args.seconds, broker_pid, args.baseline))
    finally:
        if server is not None:
            server.destroy()
    small_figures, figures, *baseline = (run.figures() for run in runs)
    table = Table(
        title=f"lagless serve: {args.groups} groups x {args.partitions} partitions "
        f"({args.groups_per_topic} per topic), interval {INTERVAL_S:g} s"
    )
    table.add_column("figure")
    table.add_column(f"{small_figures['groups']} groups", justify="right")
    table.add_column(f"{figures['groups']} groups", justify="right")
    table.add_column("ratio", justify="right")
    if baseline:
        table.add_column(f"{figures['groups']}, {args.baseline}", justify="right")
        table.add_column("this / that", justify="right")
    table.add_column("goal", justify="right")
    for key, value in figures.items():
        if key == "groups":
            continue
        row = [key, str(small_figures[key]), str(value), _ratio(value, small_figures[key])]
        if baseline:
            row += [str(baseline[0][key]), _ratio(value, baseline[0][key])]
        goal = GOALS.get(key)
        mark = "" if goal is None or value is None else (" ok" if value < goal else " MISSED")
        table.add_row(*row, "" if goal is None else f"< {goal}{mark}")
    console.print(table)
    console.print(f"load average after: {os.getloadavg()}")
    found = {"small": small_figures, "fleet": figures, "load": os.getloadavg()}
    if baseline:
        found["baseline"] = baseline[0]
    print(json.dumps(found))
    return 0


def _ratio(value: object, before: object) -> str:
    if isinstance(value, int | float) and isinstance(before, int | float) and before:
        return f"{value / before:.2f}x"
    return "-"


if __name__ == "__main__":
    sys.exit(main())
