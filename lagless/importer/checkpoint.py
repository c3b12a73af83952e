"""Reading the offsets Spark journaled for a batch in the checkpoint.

Spark writes `offsets/<batch id>` before the batch runs: a version line, a metadata line, then
one line per source with that batch's end offsets. It is the single record of what a batch
covers, so lagless reads it rather than keeping a second bookkeeping of its own.
"""

from __future__ import annotations

import json
import os

from lagless.kafka.offset_reader import Offsets
from lagless.source import from_json_offsets


def batch_end_offsets(checkpoint: str, batch_id: int) -> Offsets:
    path = os.path.join(checkpoint, "offsets", str(batch_id))
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    return from_json_offsets(json.loads(lines[2]))


def last_end_offsets(checkpoint: str) -> Offsets:
    """End offsets of the newest batch whose commit Spark recorded; {} for a new checkpoint."""
    commits = os.path.join(checkpoint, "commits")
    if not os.path.isdir(commits):
        return {}
    done = sorted((int(name) for name in os.listdir(commits) if name.isdigit()), reverse=True)
    return batch_end_offsets(checkpoint, done[0]) if done else {}


def query_id(checkpoint: str) -> str:
    """The id Spark gave the query when it created the checkpoint (`metadata`), kept for life."""
    with open(os.path.join(checkpoint, "metadata"), encoding="utf-8") as handle:
        return str(json.loads(handle.readline())["id"])
