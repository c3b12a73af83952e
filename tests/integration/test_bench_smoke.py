"""Every bench script runs to its end at a tiny volume and prints its figures.

The scripts are launched as a user launches them (a subprocess from the repository root, each
with its own embedded broker over TCP and real Spark). The figures are not judged as speeds
(the bench's job); they are checked to be there and to be numbers in a sane range, so a
script that stops working, or prints nothing, fails here. ~2-3 minutes in all on 2 cores.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lagless.kafka.config import KafkaConfig

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_bench(script: str, *args: str, timeout: float = 300) -> tuple[dict[str, Any], str]:
    """Runs bench/<script> to its end: (its last JSON line or {} if none, all it printed)."""
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "COLUMNS": "200",  # rich's tables keep their figures on one line
    }
    try:
        done = subprocess.run(
            [sys.executable, str(BENCH / script), *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as late:  # what the script said before it ran out of time
        said = (late.stdout or b"") + (late.stderr or b"")
        text = said.decode(errors="replace") if isinstance(said, bytes) else said
        pytest.fail(f"bench/{script} still running after {timeout:.0f} s:\n{text[-4000:]}")
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed[-4000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return (json.loads(lines[-1]) if lines else {}), printed


def between(value: Any, low: float, high: float) -> bool:
    return isinstance(value, int | float) and low <= value <= high


def test_import_throughput_against_the_script_and_the_breakdown_on_its_topic() -> None:
    figures, printed = run_bench(
        "import_throughput.py",
        *("--records", "4000", "--partitions", "4", "--sinks", "parquet", "--breakdown"),
    )
    assert figures["records"] == 4000
    for name in ("baseline", "script"):
        assert between(figures[name]["records_per_s"], 1, 1e9), figures[name]
        assert between(figures[name]["launch_to_exit_s"], 0.001, 300), figures[name]
    parquet = figures["parquet"]
    assert parquet["exit_code"] == 0 and parquet["records"] == 4000
    assert between(parquet["first_row_s"], 0.1, parquet["exit_s"])
    assert between(parquet["exit_x_script"], 0.01, 10_000)
    assert f"{parquet['exit_x_script']:.2f}x the script's" in printed
    breakdown = figures["breakdown"]
    assert breakdown["phases"][0]["phase"] == "launch"
    seconds = [p["at_s"] for p in breakdown["phases"]]
    assert seconds == sorted(seconds) and between(seconds[-1], 0.1, 300), breakdown
    total = breakdown["launch_to_exit_s"]
    assert between(total, 1, 300)
    # The phases account for launch → exit, each a part of it (a little slack: two clocks).
    parts = [p["s"] for p in breakdown["where"]]
    assert all(between(s, -0.5, total) for s in parts), breakdown["where"]
    assert abs(sum(parts) - total) < 0.02, breakdown["where"]
    assert "Spark session (JVM, context, session)" in printed
    script_s = figures["script"]["launch_to_exit_s"]
    assert abs(breakdown["exit_x_script"] - total / script_s) < 0.01, breakdown["exit_x_script"]
    assert f"{breakdown['exit_x_script']:.2f}x the script's" in printed
    assert between(breakdown["bar_records_per_s"], 1, 1e9)
    assert "the import's bar ends at" in printed


# A minute of CI (a SeaweedFS and three imports): scripts/test runs it, CI leaves it out.
@pytest.mark.matrix
def test_import_throughput_measures_the_stores_on_s3_beside_the_local_ones() -> None:
    sinks = ("parquet", "parquet+s3", "delta+s3", "iceberg+s3")
    figures, _ = run_bench(
        "import_throughput.py", *("--records", "2000", "--partitions", "2", "--sinks", *sinks)
    )
    for sink in sinks:
        run = figures[sink]
        assert run["exit_code"] == 0 and run["records"] == 2000, run
        assert between(run["first_row_s"], 0.1, run["exit_s"]), run


# Minutes of CI for one script each: scripts/test runs it (-m matrix), CI leaves it out.
@pytest.mark.matrix
def test_import_throughput_scaling_run_on_tansu(tmp_path: Path) -> None:
    """One backlog, on Tansu (the embedded broker's path is the run above): a scaling run's
    second volume would only add a Spark start-up to the suite."""
    png = tmp_path / "scaling.png"
    figures, printed = run_bench(
        "import_throughput.py",
        *("--volumes", "4000", "--partitions", "4", "--tansu-above", "3000"),
        *("--png", str(png)),
    )
    (point,) = figures["scaling"]
    assert point["broker"] == "tansu"
    # Tansu's partitions end with one record sent alone each (bench/tansu.py).
    assert point["records"] == 4004
    for key in ("plain_consumers_s", "script_launch_to_exit_s", "lagless_launch_to_exit_s"):
        assert between(point[key], 0.001, 300), point
    assert between(point["lagless_x_script"], 0.01, 10_000), point
    assert f"{point['lagless_x_script']:.2f}x the script's" in printed
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_script_peer_reads_with_laglesss_own_reader_settings() -> None:
    spec = importlib.util.spec_from_file_location("script_peer", BENCH / "script_peer.py")
    assert spec is not None and spec.loader is not None
    script_peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script_peer)
    settings = KafkaConfig("localhost:9092").reader()
    settings.pop("bootstrap.servers")
    settings.pop("log_level")  # lagless's clients log quietly; it changes no read
    assert settings == script_peer.READER_SETTINGS


# Minutes of CI for one script each: scripts/test runs it (-m matrix), CI leaves it out.
# Parquet's: a batch shows once its folder's ledger entry is written (the poller must know).
@pytest.mark.matrix
@pytest.mark.parametrize("sink", ["sqlite", "parquet"])
def test_latency_reports_percentiles_and_draws_its_chart(tmp_path: Path, sink: str) -> None:
    png = tmp_path / "latency.png"
    figures, _ = run_bench(
        "latency.py",
        *("--rates", "200", "--seconds", "2", "--settle-seconds", "1", "--partitions", "2"),
        *("--sink", sink, "--png", str(png)),
    )
    assert figures["exit_code"] == 0 and figures["seen"] == figures["produced"] > 0
    assert between(figures["first_row_s"], 0.1, 300)
    (rate,) = figures["rates"]
    assert rate["seen"] > 0 and between(rate["p50_s"], 0, 60) and between(rate["p99_s"], 0, 60)
    assert png.read_bytes().startswith(PNG_MAGIC)


# Minutes of CI for one script each: scripts/test runs it (-m matrix), CI leaves it out.
@pytest.mark.matrix
def test_memory_reports_the_peak_of_each_kind_of_process() -> None:
    figures, _ = run_bench(
        "memory.py", *("--large-records", "2", "--large-record-bytes", "50000", "--scale", "0.05")
    )
    assert figures["exit_code"] == 0 and figures["imported"] == figures["records"] > 0
    assert {"driver python", "jvm", "python worker"} <= set(figures["kinds"]), figures["kinds"]
    for name, kind in figures["kinds"].items():
        # A process sampled between its fork and its exec (a shell Spark starts, a worker the
        # daemon forks) may show 0.2 MiB and never more: only the main kinds are sure to grow.
        least = 1 if name in ("driver python", "jvm", "python worker") else 0.01
        assert between(kind["max_hwm_mib"], least, 24 * 1024), (name, kind)
    assert between(figures["max_total_rss_mib"], 10, 24 * 1024)


# Minutes of CI for one script each: scripts/test runs it (-m matrix), CI leaves it out.
@pytest.mark.matrix
def test_skew_drains_a_profile_with_lagless_and_a_group(tmp_path: Path) -> None:
    _, printed = run_bench(
        "skew.py",
        *("--profiles", "seed-000", "--scale-000", "0.5", "--members", "2"),
        *("--assignors", "range", "--out", str(tmp_path)),
    )
    report = json.loads((tmp_path / "skew.json").read_text())
    (profile,) = report["profiles"]
    assert [run["runner"] for run in profile["runs"]] == ["lagless", "group range, 2 members"]
    for run in profile["runs"]:
        assert run["imported"] == profile["records"] > 0, run
        assert between(run["x_ideal"], 0.01, 10_000), run
    lagless = profile["runs"][0]
    assert lagless["tasks"], "no Spark task of lagless's run in the event log"
    # Its curve counts records as the tasks read them: every record, before the drain's end.
    assert lagless["curve"][-2][1] == profile["records"], lagless["curve"]
    assert (tmp_path / "skew-seed-000.png").read_bytes().startswith(PNG_MAGIC)
    assert "Drain time" in printed


# Minutes of CI for one script each: scripts/test runs it (-m matrix), CI leaves it out.
@pytest.mark.matrix
def test_connect_start_compares_a_local_session_with_a_warm_connect_server() -> None:
    figures, printed = run_bench("connect_start.py", "--records", "400", "--partitions", "2")
    assert figures["records"] == 400
    assert between(figures["server_start_s"], 0.1, 300)
    for name in ("local", "connect_first", "connect_warm"):
        run = figures[name]
        assert between(run["first_row_s"], 0.1, run["exit_s"]), (name, run)
    ratio = figures["local"]["first_row_s"] / figures["connect_warm"]["first_row_s"]
    assert figures["local_over_warm_connect"] == pytest.approx(ratio, abs=0.002)
    assert f"{figures['local_over_warm_connect']:.2f}x" in printed


# Half a minute of CI for a flag of a script CI runs already: scripts/test runs it.
@pytest.mark.matrix
def test_breakdown_of_a_typed_json_import(tmp_path: Path) -> None:
    figures, printed = run_bench(
        "breakdown.py",
        *("--records", "3000", "--partitions", "2", "--sink", "sqlite"),
        *("--value-schema", "seq BIGINT NOT NULL, pad STRING", "--work", str(tmp_path)),
    )
    assert figures["records"] == 3000
    assert "a bulk import into sqlite (typed JSON)" in printed
    with sqlite3.connect(tmp_path / "bench.db") as db:
        columns = [row[1] for row in db.execute('PRAGMA table_info("bench")')]
        typed = db.execute('SELECT count(*) FROM "bench" WHERE "seq" IS NOT NULL').fetchone()[0]
    assert {"seq", "pad"} <= set(columns) and "value" not in columns, columns
    assert typed == 3000


def test_fleet_measures_serve_on_noida_with_the_groups_made() -> None:
    """bench/fleet.py at 20 groups: its own noida-db, two runs of `lagless serve`, and a third
    from a baseline checkout (here the same one)."""
    figures, printed = run_bench(
        "fleet.py", "--groups", "20", "--partitions", "2", "--seconds", "3",
        "--baseline", str(ROOT), timeout=240,
    )  # fmt: skip
    small, fleet, baseline = figures["small"], figures["fleet"], figures["baseline"]
    assert (small["groups"], fleet["groups"], baseline["groups"]) == (2, 20, 20)
    assert "this / that" in printed
    for run in (small, fleet, baseline):
        assert between(run["all_on_metrics_s"], 0.0, 60), run
        assert between(run["rss_mib"], 10, 300) and between(run["descriptors"], 5, 200), run
        assert run["rounds"] >= 1 and between(run["scrape_p99_s"], 0.0, 30), run
    assert "20 groups" in printed and "ratio" in printed


# Minutes of CI for one script each: scripts/test runs it (-m matrix), CI leaves it out.
@pytest.mark.matrix
def test_mirror_puts_debeziums_rate_beside_each_stores() -> None:
    from lagless.scenarios.mirror import missing

    if missing() is not None:
        pytest.skip(f"needs PostgreSQL and Debezium: {missing()}")
    _, printed = run_bench(
        "mirror.py",
        *("--rows", "3000", "--updates", "1000", "--partitions", "4", "--stores", "sqlite"),
        *("--capacity-seconds", "4", "--sustain-seconds", "5", "--sustain-rate", "100"),
        timeout=900,
    )
    rows = [line.split("|") for line in printed.splitlines() if line.startswith("| snapshot")]
    assert len(rows) == 1 and float(rows[0][5].strip().rstrip("x")) > 0, printed[-2000:]
    for phase in ("snapshot", "updates"):  # the bulk imports, with the cores each side used
        assert re.search(
            rf"^sqlite: {phase} [\d,]+ events in [\d.]+ s; cores: broker [\d.]+, lagless [\d.]+$",
            printed,
            re.M,
        ), printed[-2000:]
    # Each capacity step run says its rates, lag and the cores each part used; the summary
    # the highest rate held.
    steps = re.findall(
        r"^sqlite: ([\d,]+) events/s asked, ([\d,]+) sent: ([\d.]+) s behind; "
        r"cores: broker ([\d.]+), sender ([\d.]+), lagless ([\d.]+) \((\d+) ms per 1,000 events\)$",
        printed,
        re.M,
    )
    assert steps and all(int(sent.replace(",", "")) > 0 for _, sent, *_ in steps), printed[-2000:]
    # lagless's processes worked in every step, and the embedded broker's thread served them
    # (a few ticks a step at these rates: some step shows it).
    assert all(float(step[5]) > 0 for step in steps) and any(float(s[3]) > 0 for s in steps), steps
    assert re.search(r"^  sqlite: [\d,]+ events/s sent, [\d.]+x \(behind by step: ", printed, re.M)
    debezium = re.search(
        r"^  Debezium's CPU per 1,000 events as it streamed the updates: (\d+) ms", printed, re.M
    )
    assert debezium and int(debezium[1]) > 0, printed[-2000:]
    assert "sustained 100 updates/s" in printed
    # How fast the machine was, before and after (a fixed task's ms).
    for when in ("before", "after"):
        speed = re.search(rf"^load average {when}: [\d. ]+; machine ([\d.]+) ms$", printed, re.M)
        assert speed and float(speed[1]) > 0, printed[-2000:]


@pytest.mark.matrix
def test_first_import_shows_a_fresh_installations_first_and_second_import() -> None:
    """~4 minutes: the background build of the class archive is most of it (matrix only)."""
    figures, printed = run_bench(
        "first_import.py", *("--records", "4000", "--partitions", "2"), timeout=1500
    )
    assert figures["records"] == 4000 and "archive mapped" in printed
    for name in ("script_s", "first_s", "archive_build_s", "second_s"):
        assert between(figures[name], 0.01, 1200), (name, figures)


# Minutes of CI for one script each: scripts/test runs it (-m matrix), CI leaves it out.
@pytest.mark.matrix
def test_table_health_samples_files_bytes_reads_and_latency(tmp_path: Path) -> None:
    figures, printed = run_bench(
        "table_health.py",
        *("--stores", "delta", "--workloads", "upsert", "--seconds", "12", "--keys", "400"),
        *("--upsert-rate", "100", "--sample-seconds", "4", "--settle-seconds", "2"),
        *("--maintain-every", "1", "--keep-history", "5", "--png-dir", str(tmp_path)),
        timeout=600,
    )
    assert figures["store"] == "delta" and figures["exit_code"] == 0
    assert figures["visible"] > 0 and between(figures["p99_s"], 0.0, 60)
    last = figures["last"]
    assert last["live_bytes"] > 0 and last["bytes_on_disk"] >= last["live_bytes"]
    # Timed after the run on hard-linked versions: through polars, then deltalake itself.
    assert between(figures["worst_read_x"], 0.01, 100)
    assert between(figures["worst_own_read_x"], 0.01, 100)
    assert between(figures["broker_cores"], 0.0, 2.0)  # its thread, in the bench's process
    assert all(between(ms, 1, 60_000) for ms in figures["machine_ms"]), figures["machine_ms"]
    assert "table health under a continuous import" in printed and "machine ms" in printed
    assert (tmp_path / "table_health-delta-upsert.png").read_bytes().startswith(PNG_MAGIC)


def test_iceberg_upsert_times_both_modes_of_the_same_batches() -> None:
    """No Spark, no broker: the store's own upsert, a few seconds at this size."""
    figures, printed = run_bench(
        "iceberg_upsert.py", "--rows", "20000", "--batch", "500", "--batches", "3"
    )
    runs = {each["mode"]: each for each in figures["runs"]}
    assert set(runs) == {"merge-on-read", "copy-on-write"}
    for each in runs.values():
        assert between(each["median_s"], 0.0001, 60) and each["bytes_on_disk"] > 0
    assert between(figures["ratio"], 0.01, 1000)
    assert "copy-on-write / merge-on-read, median batch" in printed


# Five services and five JVMs on the CI's two cores: 110 s alone, past 600 s beside another
# worker's Spark tests (CI, stop 66). scripts/test --matrix other runs it; CI leaves it out.
@pytest.mark.matrix
@pytest.mark.timeout(1500)
def test_the_soak_runs_short_with_every_fault_and_ends_exact(tmp_path: Path) -> None:
    """bench/soak.py until each fault has come once, 3 s apart from when every import has
    written (its verdict on growth needs hours: left out here): a PostgreSQL workload through
    real Debezium into Delta and Iceberg mirrors, a plain topic into Delta, serve on noida-db;
    the broker down for 8 s, the plain table refusing writes for 10 s; then every table exact
    and serve answering for every group."""
    figures, printed = run_bench(
        "soak.py",
        *("--faults", "5", "--minutes", "8", "--fault-minutes", "0.05"),
        *("--warm-up-minutes", "0.5"),
        *("--broker-down-seconds", "8", "--refusal-seconds", "10"),
        *("--sample-seconds", "4", "--groups", "20", "--partitions", "4", "--rate", "100"),
        *("--no-growth-verdict", "--png-dir", str(tmp_path / "png")),
        timeout=1200,
    )
    checks = {check["kind"]: [] for check in figures["checks"]}
    for check in figures["checks"]:
        checks[check["kind"]].append(check)
    assert len(checks["equal"]) == 4 and all(c["ok"] for c in checks["equal"]), checks["equal"]
    (exact,) = checks["exact"]
    assert exact["ok"] and not exact["what"].startswith("plain table: 0 "), exact
    assert checks["serve"][0]["ok"] and "20 of 20" in checks["serve"][0]["what"]
    assert figures["faults"] == [
        "kill_mirror", "kill_debezium", "broker_down", "restart_postgres", "store_refuses",
    ]  # fmt: skip
    assert figures["samples"] >= 10
    # Each fault met what it aims at (the plain table was there to refuse writes).
    assert "every import has written: the faults begin" in printed
    assert "the plain table refused writes for 10 s" in printed, printed[-3000:]
    assert any("python MiB" in c["what"] for c in checks["growth"]), printed[-2000:]
    assert (tmp_path / "png" / "soak-visible-p99-s.png").read_bytes().startswith(PNG_MAGIC)
