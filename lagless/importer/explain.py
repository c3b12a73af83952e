"""`--explain`: the plan of the next batch, computed by the very code a run would use."""

from __future__ import annotations

import os
import re
from collections import Counter
from typing import Any

from lagless.importer.checkpoint import last_end_offsets
from lagless.importer.cluster import master_url
from lagless.importer.plan import check, source_options
from lagless.importer.routing import Destination
from lagless.importer.spec import ImportSpec, slots_for
from lagless.source import to_json_offsets
from lagless.source.datasource import KafkaStreamReader, RangePartition
from lagless.source.options import SourceOptions


def default_slots(master: str | None, conf: dict[str, str]) -> int:
    """Slots as a run would plan them, without starting Spark for a local master."""
    master = master_url(master)
    local = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master)
    if local:
        cores = local.group(1)
        return slots_for(os.cpu_count() or 1 if cores in (None, "*") else int(cores))
    from lagless.importer.spark import parallelism, spark_session

    return slots_for(parallelism(spark_session(master, conf=conf)))


def explain(spec: ImportSpec) -> dict[str, Any]:
    """The next batch's tasks, and the tables it writes into: each with its topics, what its
    ledger holds, and the records of the next batch that are its own."""
    plan = check(spec)
    slots = spec.slots or default_slots(spec.master, dict(spec.spark_conf))
    with plan.sink, plan.reader:
        # As a run would: nothing a table holds already is planned (sinks/ledger.py).
        for each in plan.destinations:
            each.held = plan.sink.ledger(each.target, each.partitions)
    options = source_options(plan, slots)
    reader = KafkaStreamReader(SourceOptions.parse(options))
    table_of = {topic: each.target.table for each in plan.destinations for topic in each.topics}
    try:
        if spec.mode == "bulk":
            reader.prepareForTriggerAvailableNow()
        done = last_end_offsets(spec.checkpoint)
        start = to_json_offsets(done) if done else reader.initialOffset()
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        tasks = []
        for task in reader.partitions(start, end):
            assert isinstance(task, RangePartition)
            pieces: list[dict[str, Any]] = [
                {
                    "topic": piece.topic,
                    "table": table_of[piece.topic],
                    "partition": piece.partition,
                    "from": piece.start,
                    "until": piece.end,
                    "records": piece.records,
                    "bytes": reader.estimated_bytes(piece),
                }
                for piece in task.pieces
            ]
            tasks.append(
                {
                    "records": sum(p["records"] for p in pieces),
                    "bytes": sum(p["bytes"] for p in pieces),
                    "pieces": pieces,
                }
            )
    finally:
        reader.stop()
    return {"slots": slots, "tables": _tables(plan.destinations, tasks), "tasks": tasks}


def _tables(destinations: list[Destination], tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    records: Counter[str] = Counter()
    planned: Counter[str] = Counter()
    for task in tasks:
        for piece in task["pieces"]:
            records[piece["table"]] += piece["records"]
            planned[piece["table"]] += 1
    return [
        {
            "table": each.target.table,
            "topics": list(each.topics),
            "partitions": len(each.partitions),
            "holds": to_json_offsets(each.held),
            "records": records[each.target.table],
            "pieces": planned[each.target.table],
        }
        for each in destinations
    ]
