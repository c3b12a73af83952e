"""An Iceberg upsert batch, merge-on-read against copy-on-write, same run (issue 32).

The store's own part of an upsert (IcebergSink.upsert_rows: the held rows of the batch's keys
found, then one commit), without Spark or Kafka: a table preloaded with --rows rows, then
--batches batches of --batch random keys each, into a merge-on-read table (lagless's default:
position deletes, sinks/iceberg/row_delta.py) and a copy-on-write one (`write.merge.mode` set
so). Prints each mode's median and slowest batch, the ratio, and the table's bytes on disk
after the batches (no maintenance runs: a continuous import's rounds fold the deletes).

    .venv/bin/python bench/iceberg_upsert.py                  # 1M rows, 10k a batch
    .venv/bin/python bench/iceberg_upsert.py --rows 20000 --batch 500 --batches 3
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lagless.sinks import sink_from_url  # noqa: E402
from lagless.sinks.base import TOMBSTONE, Target  # noqa: E402
from lagless.sinks.iceberg.row_delta import MERGE_MODE  # noqa: E402
from lagless.sinks.ledger import Batch  # noqa: E402
from lagless.sinks.upsert_order import LOG_TIME  # noqa: E402

TARGET = Target("events", "upsert", "raw", run_id="bench")
TOPIC = "events"


def rows(keys: list[int], first_offset: int) -> pa.Table:
    """Records of `keys`, one each, at offsets from `first_offset` (newer than any before)."""
    count = len(keys)
    offsets = list(range(first_offset, first_offset + count))
    return pa.table(
        {
            "topic": [TOPIC] * count,
            "partition": pa.array([0] * count, pa.int32()),
            "offset": offsets,
            "key": [b"key-%07d" % k for k in keys],
            "value": [b"v" * 24] * count,
            "timestamp": offsets,
            LOG_TIME: offsets,
            TOMBSTONE: [False] * count,
        }
    )


def run(mode: str, args: argparse.Namespace, folder: Path) -> dict[str, object]:
    sink = sink_from_url(f"iceberg:///{folder}/{mode}")
    sink.prepare(TARGET)
    if mode == "copy-on-write":
        for name in (TARGET.table, TARGET.tombstone_table):
            with sink._table(name).transaction() as tx:  # type: ignore[attr-defined]
                tx.set_properties({MERGE_MODE: "copy-on-write"})
    sink.upsert_rows(
        rows(list(range(args.rows)), 0), TARGET, Batch(0, {(TOPIC, 0): (0, args.rows)})
    )
    chooser = random.Random(args.seed)
    offset = args.rows
    seconds = []
    for n in range(1, args.batches + 1):
        keys = sorted({chooser.randrange(args.rows) for _ in range(args.batch)})
        batch = Batch(n, {(TOPIC, 0): (offset, offset + len(keys))})
        began = time.monotonic()
        sink.upsert_rows(rows(keys, offset), TARGET, batch)
        seconds.append(time.monotonic() - began)
        offset += len(keys)
    sink.close()
    on_disk = sum(f.stat().st_size for f in (folder / mode).rglob("*") if f.is_file())
    return {
        "mode": mode,
        "median_s": round(statistics.median(seconds), 3),
        "slowest_s": round(max(seconds), 3),
        "bytes_on_disk": on_disk,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lagless-bench-iceberg-") as work:
        found = [run(mode, args, Path(work)) for mode in ("merge-on-read", "copy-on-write")]
    for each in found:
        print(
            f"{each['mode']:>14}: median {each['median_s']:.3f} s a batch, slowest "
            f"{each['slowest_s']:.3f} s, {int(each['bytes_on_disk']) / 1e6:,.1f} MB on disk"
        )
    ratio = float(found[1]["median_s"]) / max(float(found[0]["median_s"]), 1e-9)  # type: ignore[arg-type]
    print(f"copy-on-write / merge-on-read, median batch: {ratio:.1f}x")
    print(json.dumps({"rows": args.rows, "batch": args.batch, "runs": found, "ratio": ratio}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
