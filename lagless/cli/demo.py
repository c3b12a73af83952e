"""`lagless demo`: the seed-000 backlog drained on a laptop with nothing else running.

Starts the embedded broker, fills a 24-partition topic shaped like seed 000's lag table,
shows the lag table, imports everything into SQLite in bulk, and shows the table again.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile

from rich.console import Console
from rich.table import Table

from lagless.broker import EmbeddedBroker
from lagless.exceptions import TerminalError
from lagless.gen import build_profile, produce_profile
from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from lagless.kafka.config import KafkaConfig
from lagless.kafka.offset_reader import OffsetReader
from lagless.progress import RichCollector

TOPIC = "statements"
GROUP = "lagless-demo"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "demo",
        help="drain a seed-000 shaped backlog from the embedded broker into SQLite",
        description=__doc__,
    )
    parser.add_argument(
        "--out", help="folder for demo.db and the checkpoint (default: a new temporary folder)"
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=10.0,
        help="size of the backlog: seed 000's lag / 1000 times this (default %(default)s: "
        "1.35M records)",
    )
    parser.set_defaults(func=handle)


def lag_table(config: KafkaConfig, title: str) -> tuple[Table, int]:
    """The seed's columns: partition | lag | pos (the group's committed offset) | end."""
    with OffsetReader(config) as broker:
        partitions = broker.partitions([TOPIC])
        low, high = broker.watermarks(partitions)
        committed = broker.committed(GROUP, partitions)
    rows = []
    for tp in partitions:
        pos = committed.get(tp)
        rows.append((tp[1], high[tp] - (low[tp] if pos is None else pos), pos, high[tp]))
    table = Table(title=title)
    for name in ("partition", "lag", "pos", "end"):
        table.add_column(name, justify="right")
    total = sum(r[1] for r in rows)
    table.add_row(
        "All", f"{total:,}", f"{sum(r[2] or 0 for r in rows):,}", f"{sum(r[3] for r in rows):,}"
    )
    for partition, lag, pos, end in rows:
        table.add_row(str(partition), f"{lag:,}", "-" if pos is None else f"{pos:,}", f"{end:,}")
    return table, total


def handle(args: argparse.Namespace) -> int:
    console = Console()
    out = args.out or tempfile.mkdtemp(prefix="lagless-demo-")
    os.makedirs(out, exist_ok=True)
    database = os.path.join(out, "demo.db")
    checkpoint = os.path.join(out, "checkpoint")
    for stale in (database,):
        if os.path.exists(stale):
            os.remove(stale)
    profile = build_profile("seed-000", partitions=24, scale=args.scale)
    with EmbeddedBroker(topics={TOPIC: profile.partitions}) as broker:
        config = KafkaConfig(broker.bootstrap)
        console.print(
            f"embedded broker at {broker.bootstrap}; producing the seed-000 backlog to {TOPIC!r}"
        )
        # zstd: the embedded broker keeps ~5 MB per partition, twice the records of lz4.
        produced = produce_profile(config, TOPIC, profile, keys=1_000, compression="zstd")
        console.print(f"produced {produced.records:,} records in {produced.seconds:.1f} s")
        before, _ = lag_table(config, f"lag of group {GROUP!r} before the import")
        console.print(before)
        spec = ImportSpec(
            kafka=config,
            topics=(TOPIC,),
            sink_url=f"sqlite:///{database}",
            checkpoint=os.path.join(
                checkpoint, broker.bootstrap.replace(":", "_").replace(",", "_")
            ),
            group=GROUP,
        )
        summary = run_import(spec, RichCollector(console))
        after, remaining = lag_table(config, f"lag of group {GROUP!r} after the import")
        console.print(after)
    with sqlite3.connect(database) as conn:
        stored = conn.execute(f'SELECT count(*) FROM "{TOPIC}"').fetchone()[0]
    console.print(
        f"{stored:,} rows in {database} (table {TOPIC}); {summary.records:,} records read"
    )
    if remaining or stored != produced.records:
        raise TerminalError(
            f"demo ended with lag {remaining} and {stored} of {produced.records} records stored"
        )
    return 0
