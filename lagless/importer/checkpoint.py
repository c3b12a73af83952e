"""Reading the offsets Spark journaled for a batch in the checkpoint, and what the checkpoint
was made for.

Spark writes `offsets/<batch id>` before the batch runs: a version line (`v1`), a metadata line,
then one line per source with that batch's end offsets. It is the single record of what a batch
covers, so lagless reads it rather than keeping a second bookkeeping of its own.

Those offsets mean something only for the topics, store and table they were read into: lagless
keeps that in `lagless.json` beside Spark's files (a Fit), and refuses any other use of the
checkpoint, which would otherwise resume "where it stopped" in another topic or table. What the
committed batches read (`committed_ranges`) the table must still hold: importer/resume.py refuses
a table that lost it (sinks/ledger.py's `lacking`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import urllib.parse
from dataclasses import asdict, dataclass, fields
from typing import Any

from lagless.exceptions import BadInput
from lagless.kafka import TP, Offsets
from lagless.source import from_json_offsets, to_json_offsets

FIT_FILE = "lagless.json"
# Where the query's first batch starts (write_first_start): Spark journals batches' ends only.
FIRST_START_FILE = "lagless-first-batch.json"
FIT_VERSION = 1
# The version line of the offset files lagless reads (Spark's OffsetSeqLog.VERSION).
OFFSETS_VERSION = "v1"


@dataclass(frozen=True)
class Fit:
    """What decides which rows a checkpoint's offsets stand for: topics (or the pattern they
    match), where they land (no secret, an absolute location), table (or the template of a
    table per topic: importer/routing.py), write mode, value format and upsert key. The value
    schema is left out on purpose: a field added evolves the table, and an incompatible change
    is the store's own check."""

    topics: tuple[str, ...]
    sink: str
    table: str
    write: str
    value_format: str
    key_fields: tuple[str, ...] = ()
    # --topic-pattern; "" for named topics (and in the records of a lagless before routing).
    pattern: str = ""

    @classmethod
    def of(
        cls,
        topics: tuple[str, ...] | list[str],
        sink: str,
        table: str,
        write: str,
        value_format: str,
        key_fields: tuple[str, ...] = (),
        pattern: str = "",
    ) -> Fit:
        return cls(
            tuple(sorted(set(topics))),
            sink,
            table,
            write,
            value_format,
            tuple(key_fields),
            pattern,
        )

    def to_json(self) -> dict[str, Any]:
        return {"version": FIT_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, doc: object, where: str) -> Fit:
        if not isinstance(doc, dict):
            raise BadInput(f"checkpoint record {where} is not a JSON object")
        if doc.get("version") != FIT_VERSION:
            raise BadInput(
                f"checkpoint record {where} has version {doc.get('version')!r}; "
                f"this lagless reads version {FIT_VERSION}"
            )
        values: dict[str, Any] = {}
        for field in fields(cls):
            value = doc.get(field.name, field.default)
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                value = tuple(value)
            if not isinstance(value, tuple | str):
                raise BadInput(f"checkpoint record {where} has no valid {field.name!r}")
            values[field.name] = value
        return cls(**values)

    def misfit(self, wanted: Fit) -> str | None:
        """The first way `wanted` differs from what the checkpoint was made for; None: fits."""
        for field, option in _OPTIONS.items():
            made, asked = getattr(self, field), getattr(wanted, field)
            if made != asked:
                return f"it was made for {option} {_shown(made)}, not {_shown(asked)}"
        return None


# How each Fit field is given on the command line, to say a misfit in the user's words.
_OPTIONS = {
    "topics": "--topic",
    "pattern": "--topic-pattern",
    "sink": "--sink",
    "table": "--table",
    "write": "--write",
    "value_format": "--value-format",
    "key_fields": "--key-field",
}


def _shown(value: str | tuple[str, ...]) -> str:
    if isinstance(value, tuple):
        return ",".join(value) or "(none)"
    return value or "(none)"


def check_fit(checkpoint: str, wanted: Fit) -> bool:
    """Raise BadInput if the checkpoint was made for something else; True when the record
    needs writing (a new checkpoint, or one an earlier lagless made, adopted)."""
    where = os.path.join(checkpoint, FIT_FILE)
    journaled = journaled_batches(checkpoint)
    if os.path.exists(where):
        made = read_fit(checkpoint)
        misfit = made.misfit(wanted)
        if misfit is None:
            return False
        if journaled:
            raise BadInput(f"checkpoint {checkpoint!r} does not fit: {misfit}")
        return True  # nothing was read under it: the record is the new use's
    if journaled:
        # Made by a lagless that kept no record: adopted, if its offsets are of these topics.
        topics = sorted({topic for topic, _ in batch_end_offsets(checkpoint, journaled[-1])})
        if wanted.pattern:
            others = [t for t in topics if not re.fullmatch(wanted.pattern, t)]
            if others:
                raise BadInput(
                    f"checkpoint {checkpoint!r} does not fit: it holds offsets of --topic "
                    f"{others[0]}, which --topic-pattern {wanted.pattern!r} does not match"
                )
        elif topics and topics != list(wanted.topics):
            raise BadInput(
                f"checkpoint {checkpoint!r} does not fit: it holds offsets of --topic "
                f"{','.join(topics)}, not {','.join(wanted.topics)}"
            )
    return True


def read_fit(checkpoint: str) -> Fit:
    where = os.path.join(checkpoint, FIT_FILE)
    try:
        with open(where, encoding="utf-8") as handle:
            doc = json.load(handle)
    except (OSError, ValueError) as exc:
        raise BadInput(f"cannot read checkpoint record {where!r}: {exc}") from None
    return Fit.from_json(doc, repr(where))


def write_fit(checkpoint: str, fit: Fit) -> None:
    """Whole or not at all: a crash leaves the old record or none, never half of one."""
    os.makedirs(checkpoint, exist_ok=True)
    where = os.path.join(checkpoint, FIT_FILE)
    partial = f"{where}.partial"
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(fit.to_json(), handle, indent=1)
        handle.write("\n")
    os.replace(partial, where)


# Batches whose store commits run after Spark recorded them committed (mark_storing).
STORING = "storing"


def write_first_start(checkpoint: str, start: Offsets) -> None:
    """Where the query's first batch starts, kept until a batch is committed (the batch's own
    start is not in Spark's journal): `committed_ranges` reads it."""
    if _batch_ids(os.path.join(checkpoint, "commits")):
        return  # the first batch is committed: its start was kept by the run that ran it
    where = os.path.join(checkpoint, FIRST_START_FILE)
    partial = f"{where}.partial"
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(to_json_offsets(start), handle)
    os.replace(partial, where)


def committed_ranges(checkpoint: str, before: int | None = None) -> dict[TP, tuple[int, int]]:
    """Per partition, the offsets the checkpoint's committed batches (those below `before`,
    when given) read: from the start of the oldest one whose start is known (the first
    batch's, kept by write_first_start, or the end of the batch before it) to the end of the
    newest. {} for a new checkpoint."""
    done = [
        batch
        for batch in _batch_ids(os.path.join(checkpoint, "commits"))
        if before is None or batch < before
    ]
    if not done:
        return {}
    end = batch_end_offsets(checkpoint, done[-1])
    start = _batch_start(checkpoint, done[0])
    if start is None:  # not known: from the end of the oldest batch on
        start = batch_end_offsets(checkpoint, done[0])
    return {tp: (min(start.get(tp, offset), offset), offset) for tp, offset in end.items()}


def newest_committed(checkpoint: str) -> tuple[int, Offsets | None, Offsets] | None:
    """The newest batch Spark recorded as committed: its id, where it started (None: not
    known) and where it ended; None for a checkpoint without one."""
    done = _batch_ids(os.path.join(checkpoint, "commits"))
    if not done:
        return None
    newest = done[-1]
    return newest, _batch_start(checkpoint, newest), batch_end_offsets(checkpoint, newest)


# Tables a schema change stopped (--schema-changes evolve): one file each, the reason in it.
STOPPED = "stopped-tables"


def stop_table(checkpoint: str, table: str, reason: str) -> None:
    """`table` is left out of this checkpoint's batches from now on (importer/job.py); a rerun
    keeps it out, and says why."""
    folder = os.path.join(checkpoint, STOPPED)
    os.makedirs(folder, exist_ok=True)
    where = os.path.join(folder, urllib.parse.quote(table, safe=""))
    with open(f"{where}.partial", "w", encoding="utf-8") as handle:
        json.dump({"table": table, "reason": reason}, handle)
    os.replace(f"{where}.partial", where)


def stopped_tables(checkpoint: str) -> dict[str, str]:
    """The tables stop_table stopped, each with its reason."""
    folder = os.path.join(checkpoint, STOPPED)
    found = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not name.endswith(".partial"):
            with open(os.path.join(folder, name), encoding="utf-8") as handle:
                doc = json.load(handle)
            found[str(doc["table"])] = str(doc["reason"])
    return found


def mark_storing(checkpoint: str, batch_id: int) -> None:
    """The store commits `batch_id` after Spark records it as committed (batch_writer.py's
    overlap): a run that ends between the two leaves this mark, and the next one reads the
    batch again (importer/job.py)."""
    folder = os.path.join(checkpoint, STORING)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, str(batch_id)), "w", encoding="utf-8"):
        pass


def unmark_storing(checkpoint: str, batch_id: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(checkpoint, STORING, str(batch_id)))


def marked_storing(checkpoint: str) -> list[int]:
    """Batches whose store commits had not ended when their run did, oldest first."""
    return _batch_ids(os.path.join(checkpoint, STORING))


def uncommit(checkpoint: str, batch_id: int) -> None:
    """Spark's record that `batch_id` (its newest) was committed, removed: its next run reads
    the batch again from its journaled offsets, as after a crash before the record."""
    commits = os.path.join(checkpoint, "commits")
    for name in (str(batch_id), f".{batch_id}.crc"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(commits, name))


def _batch_start(checkpoint: str, batch_id: int) -> Offsets | None:
    if batch_id == 0:
        path = os.path.join(checkpoint, FIRST_START_FILE)
        if not os.path.exists(path):
            return None  # a checkpoint of an earlier lagless
        with open(path, encoding="utf-8") as handle:
            return from_json_offsets(json.load(handle))
    try:
        return batch_end_offsets(checkpoint, batch_id - 1)
    except OSError:  # Spark keeps the offsets of its last 100 batches only
        return None


def journaled_batches(checkpoint: str) -> list[int]:
    """Ids of the batches Spark journaled offsets for, oldest first."""
    return _batch_ids(os.path.join(checkpoint, "offsets"))


def batch_end_offsets(checkpoint: str, batch_id: int) -> Offsets:
    path = os.path.join(checkpoint, "offsets", str(batch_id))
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    return parse_offsets_file(lines, path)


def parse_offsets_file(lines: list[str], path: str) -> Offsets:
    """Spark's offset file: `v1`, the batch's metadata, then the source's offsets as JSON."""
    version = lines[0] if lines else ""
    if version != OFFSETS_VERSION:
        raise BadInput(
            f"checkpoint offsets {path!r} have version {version[:20]!r}; "
            f"lagless reads {OFFSETS_VERSION} (a checkpoint of another Spark?)"
        )
    try:
        doc = json.loads(lines[2])
        if not isinstance(doc, dict):
            raise ValueError(f"{doc!r} is not a JSON object")
        return from_json_offsets(doc)
    except (IndexError, ValueError, TypeError, AttributeError) as exc:
        raise BadInput(f"checkpoint offsets {path!r} are not lagless's: {exc}") from None


def last_end_offsets(checkpoint: str) -> Offsets:
    """End offsets of the newest batch whose commit Spark recorded; {} for a new checkpoint."""
    done = _batch_ids(os.path.join(checkpoint, "commits"))
    return batch_end_offsets(checkpoint, done[-1]) if done else {}


def last_journaled_offsets(checkpoint: str) -> Offsets:
    """End offsets of the newest batch Spark journaled, committed or not (a rerun replays an
    uncommitted one up to there); {} for a new checkpoint."""
    journaled = journaled_batches(checkpoint)
    return batch_end_offsets(checkpoint, journaled[-1]) if journaled else {}


def query_id(checkpoint: str) -> str:
    """The id Spark gave the query when it created the checkpoint (`metadata`), kept for life."""
    with open(os.path.join(checkpoint, "metadata"), encoding="utf-8") as handle:
        return str(json.loads(handle.readline())["id"])


def _batch_ids(folder: str) -> list[int]:
    if not os.path.isdir(folder):
        return []
    return sorted(int(name) for name in os.listdir(folder) if name.isdigit())
