"""A fresh installation's first and second `lagless import`, beside the script peer.

The driver JVM starts sooner from a class archive (lagless/importer/class_archive.py); a
fresh installation has none until its first import ends, which starts building it in the
background. This bench gives lagless an empty cache (its own XDG_CACHE_HOME), fills one topic,
then, all in one run: the script peer (bench/script_peer.py) launch to exit; the first import
(no archive) launch to exit; the wait for the background build; a second import (the archive
mapped) launch to exit, into a fresh table and checkpoint, so both read the same records.
Prints a table, each import's launch to exit as a ratio to the script's, and one JSON line.

    .venv/bin/python bench/first_import.py [--records 1350000] [--partitions 24]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import Launched, import_args
from rich.console import Console
from rich.table import Table

from lagless.broker import EmbeddedBroker
from lagless.gen import explicit, produce_profile
from lagless.kafka.config import KafkaConfig

TOPIC = "first"
console = Console()


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_350_000, metavar="N")
    parser.add_argument("--partitions", type=int, default=24, metavar="N")
    parser.add_argument("--build-timeout", type=float, default=900.0, metavar="S")
    parser.add_argument("--master", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--import-option", action="append", default=[], help=argparse.SUPPRESS)
    return parser.parse_args()


def script_peer(bootstrap: str, out: Path) -> float:
    """bench/script_peer.py as a user runs it: seconds from launch to exit."""
    started = time.time()
    done = subprocess.run(
        [
            *(sys.executable, str(Path(__file__).with_name("script_peer.py"))),
            *("--bootstrap", bootstrap, "--topic", TOPIC, "--out", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"script_peer.py exited {done.returncode}: {done.stderr[-2000:]}")
    return time.time() - started


def lagless_import(bootstrap: str, work: Path, name: str, args: argparse.Namespace) -> float:
    url = f"parquet:///{work}/{name}"
    launched = Launched(
        import_args(bootstrap, TOPIC, url, work / f"{name}-ckpt", "bulk", args),
        "parquet",
        url,
        TOPIC,
        probe=False,
    )
    run = launched.wait()
    if run.returncode != 0:
        raise RuntimeError(f"lagless import exited {run.returncode}: {run.stderr_tail}")
    return run.exit_s


def wait_for_archive(timeout_s: float) -> float:
    """Seconds until the background build installed the archive."""
    from lagless.importer.class_archive import archive_path

    path = archive_path()
    if path is None:
        raise RuntimeError("no Java found: no class archive to build")
    started = time.time()
    while not path.is_file():
        if time.time() - started > timeout_s:
            raise RuntimeError(f"the background build made no archive in {timeout_s:.0f} s")
        time.sleep(0.5)
    return time.time() - started


def main() -> int:
    args = parse()
    with tempfile.TemporaryDirectory(prefix="lagless-first-import-") as folder:
        work = Path(folder)
        # A fresh installation: no archive in lagless's cache (the imports inherit this).
        os.environ["XDG_CACHE_HOME"] = str(work / "cache")
        os.environ.pop("LAGLESS_CLASS_ARCHIVE", None)
        load_before = os.getloadavg()[0]
        per_partition = max(1, args.records // args.partitions)
        with EmbeddedBroker(topics={TOPIC: args.partitions}) as broker:
            produce_profile(
                KafkaConfig(broker.bootstrap),
                TOPIC,
                explicit([per_partition] * args.partitions),
                compression="zstd",
            )
            script_s = script_peer(broker.bootstrap, work / "script")
            first_s = lagless_import(broker.bootstrap, work, "first", args)
            build_s = wait_for_archive(args.build_timeout)
            second_s = lagless_import(broker.bootstrap, work, "second", args)
        load_after = os.getloadavg()[0]
    table = Table(title=f"{per_partition * args.partitions:,} records, launch to exit")
    for column in ("run", "seconds", "x script"):
        table.add_column(column, justify="left" if column == "run" else "right")
    table.add_row("script peer (2 processes, pyarrow Parquet)", f"{script_s:.1f}", "1.00")
    table.add_row(
        "lagless import, first (no class archive)", f"{first_s:.1f}", f"{first_s / script_s:.2f}"
    )
    table.add_row("  the archive built in the background", f"{build_s:.1f}", "")
    table.add_row(
        "lagless import, second (archive mapped)", f"{second_s:.1f}", f"{second_s / script_s:.2f}"
    )
    console.print(table)
    console.print(f"load average {load_before:.1f} before, {load_after:.1f} after")
    print(
        json.dumps(
            {
                "records": per_partition * args.partitions,
                "script_s": round(script_s, 2),
                "first_s": round(first_s, 2),
                "archive_build_s": round(build_s, 2),
                "second_s": round(second_s, 2),
                "first_x_script": round(first_s / script_s, 3),
                "second_x_script": round(second_s / script_s, 3),
                "load": [round(load_before, 1), round(load_after, 1)],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
