"""The Delta mirror's driver memory over many small batches, without Spark or a broker.

The driver's part of a continuous Debezium mirror into Delta, as bench/soak.py's mirror runs
it: each batch's change file written as a task writes it (importer/change_files.py), coalesced,
upserted by DeltaSink.upsert_rows (tombstones, newer wins, the rewrite of the files holding
its keys, the kept files), and the maintenance schedule after it (every 30 s, history 60 s).
Every --every batches it prints the resident memory, pyarrow's allocated bytes, the files the
sink keeps and each one's chunks, and with --trace Python's traced memory and the lines whose
allocations grew most since the last print (tracemalloc; slow). What grows with the batches,
not with the table (--keys bounds it), is the driver's to keep.

    .venv/bin/python bench/delta_mirror_memory.py [--batches 1000] [--every 200] [--trace]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import tempfile
import time
import tracemalloc
from pathlib import Path

import pyarrow as pa

from lagless.importer import change_files
from lagless.importer.maintenance import schedule_for
from lagless.planner.ranges import OffsetRange
from lagless.sinks import sink_from_url
from lagless.sinks.base import Target
from lagless.sinks.delta import DeltaSink
from lagless.sinks.ledger import Batch
from lagless.sinks.maintenance import Policy
from tests.unit.test_cdc_envelope import FIELDS, ROW, event, key
from tests.unit.test_change_files import TOPIC, records

TARGET = Target("t", "upsert", "debezium", FIELDS, ("id",), run_id="bench")
POLICY = Policy(target_file_size=64 * 2**20, keep_history_s=60, thorough=False)


def resident_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096 / 2**20


def events(rng: random.Random, count: int, keys: int, lsn: int) -> list[tuple[bytes, bytes]]:
    """Updates of random keys, one in ten a delete."""
    made = []
    for at in range(lsn, lsn + count):
        id_ = rng.randrange(keys)
        if rng.random() < 0.1:
            made.append((key(id_), event("d", None, before={**ROW, "id": id_}, lsn=at)))
        else:
            made.append((key(id_), event("u", {**ROW, "id": id_, "n": at}, lsn=at)))
    return made


def one_batch(sink: DeltaSink, work: Path, number: int, values: list, log_times: dict) -> None:
    """A batch as the mirror's driver runs it, its records at offsets number * len(values)."""
    start = number * len(values)
    folder = work / "changes" / str(number)
    config = json.loads(change_files.task_config(str(folder), {TOPIC: TARGET}))
    piece = OffsetRange(TOPIC, 0, start, start + len(values))
    path, _ = change_files.writer(config).write([piece], iter([records(0, start, values)]))
    done = change_files.coalesce(change_files.read_changes([path]), TARGET, log_times)
    batch = Batch(number, {(TOPIC, 0): (start, start + len(values))})
    batch.log_times.update({tp: max(ms, log_times.get(tp, ms)) for tp, ms in done.newest.items()})
    log_times.update(batch.log_times)
    sink.upsert_rows(done.rows, TARGET, batch)
    change_files.clear(str(folder))


def report(number: int, sink: DeltaSink, started: float, last: list) -> None:
    gc.collect()
    kept = sink._written._frames.values()
    print(
        f"batch {number}: {resident_mib():.1f} MiB resident, pyarrow "
        f"{pa.total_allocated_bytes() / 2**20:.2f} MiB, {len(kept)} files kept, their chunks "
        f"{[frame.n_chunks() for frame, _ in kept]}, {time.monotonic() - started:.0f} s",
        flush=True,
    )
    if tracemalloc.is_tracing():
        snapshot = tracemalloc.take_snapshot()
        print(f"  traced {tracemalloc.get_traced_memory()[0] / 2**20:.2f} MiB")
        for grown in snapshot.compare_to(last[0], "lineno")[:5] if last else []:
            print(f"  {grown}")
        last[:] = [snapshot]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--every", type=int, default=200)
    parser.add_argument("--events", type=int, default=20, help="a batch's change events")
    parser.add_argument("--keys", type=int, default=5000, help="the source table's rows")
    parser.add_argument("--trace", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        sink = sink_from_url(f"delta:///{work / 'lake'}")
        assert isinstance(sink, DeltaSink)
        sink.check(TARGET)
        sink.prepare(TARGET)
        schedule = schedule_for(sink, TARGET.run_id, lambda: [TARGET.table], POLICY, 30.0)
        assert schedule is not None
        rng = random.Random(1)
        log_times: dict[tuple[str, int], int] = {}
        last: list[tracemalloc.Snapshot] = []
        if args.trace:
            tracemalloc.start()
        started = time.monotonic()
        for number in range(args.batches):
            values = events(rng, args.events, args.keys, number * args.events + 1)
            one_batch(sink, work, number, values, log_times)
            schedule.between_batches([TARGET.table])
            if (number + 1) % args.every == 0:
                report(number + 1, sink, started, last)


if __name__ == "__main__":
    main()
