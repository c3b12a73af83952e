"""Launch to first row: a fresh local Spark session against a warm Spark Connect server.

Every `lagless import` on a local master starts a driver JVM and Spark's Python workers before
it reads a record; through `--master sc://host:port` the server has them running already. In
one run, on one topic of the embedded broker: an import on the default local master, then two
imports through a Spark Connect server started here (tests/harness/connect.py, on a free port):
the first warms the server (its Python workers, the source's class), the second is what every
later import pays. Each import writes a store of its own, so each has rows to land; a thread
probes the store until the first row is visible. Prints the seconds and the ratio (local /
warm Connect) as a table and one JSON line.

    .venv/bin/python bench/connect_start.py [--records 20000] [--partitions 4] [--sink sqlite]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from benchlib import ROOT, CliRun, Launched, import_args, sink_url
from rich.console import Console
from rich.table import Table

from lagless.broker import EmbeddedBroker
from lagless.gen import explicit, produce_profile
from lagless.kafka.config import KafkaConfig

TOPIC = "connect_start"
console = Console(stderr=True)


def one_import(
    bootstrap: str, work: Path, name: str, sink: str, master: str | None, timeout_s: float
) -> CliRun:
    folder = work / name
    folder.mkdir()
    url = sink_url(sink, folder)
    options = SimpleNamespace(master=master, import_option=[])
    args = import_args(bootstrap, TOPIC, url, folder / "ckpt", "bulk", options)
    run = Launched(args, name, url, TOPIC).wait(timeout_s=timeout_s)
    if run.returncode != 0:
        raise SystemExit(f"{name}: exit {run.returncode}\n{run.stderr_tail}")
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--sink", default="sqlite", choices=["sqlite", "parquet"])
    parser.add_argument("--cores", type=int, default=2, help="the Connect server's local[N]")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    from tests.harness.connect import ConnectServer

    work = Path(tempfile.mkdtemp(prefix="lagless-connect-bench-"))
    per_partition = [args.records // args.partitions] * args.partitions
    try:
        with EmbeddedBroker(topics={TOPIC: args.partitions}) as broker:
            produce_profile(KafkaConfig(broker.bootstrap), TOPIC, explicit(per_partition))
            records = sum(per_partition)
            started = time.monotonic()
            server = ConnectServer.start_new(cores=args.cores)
            server_s = time.monotonic() - started
            try:
                runs = {
                    "local": one_import(
                        broker.bootstrap, work, "local", args.sink, None, args.timeout
                    ),
                    "connect_first": one_import(
                        broker.bootstrap, work, "connect_first", args.sink, server.url, args.timeout
                    ),
                    "connect_warm": one_import(
                        broker.bootstrap, work, "connect_warm", args.sink, server.url, args.timeout
                    ),
                }
            finally:
                server.destroy()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    for name, run in runs.items():
        if run.records != records or run.first_row_s is None:
            raise SystemExit(f"{name}: {run.records} of {records} records, {run.summary}")
    local, warm = runs["local"], runs["connect_warm"]
    assert local.first_row_s is not None and warm.first_row_s is not None
    ratio = local.first_row_s / warm.first_row_s
    table = Table(title=f"launch to first row, {records:,} records into {args.sink}")
    for column in ("import", "first row s", "exit s"):
        table.add_column(column)
    for name, run in runs.items():
        table.add_row(name, f"{run.first_row_s:.2f}", f"{run.exit_s:.2f}")
    console.print(table)
    console.print(
        f"a fresh local session takes {ratio:.2f}x a warm Spark Connect server's time to the "
        f"first row (the server itself started in {server_s:.1f} s, once)"
    )
    print(
        json.dumps(
            {
                "records": records,
                "sink": args.sink,
                "server_start_s": round(server_s, 2),
                **{
                    name: {
                        "first_row_s": round(run.first_row_s or 0.0, 3),
                        "exit_s": round(run.exit_s, 3),
                    }
                    for name, run in runs.items()
                },
                "local_over_warm_connect": round(ratio, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
