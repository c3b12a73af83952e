"""Which table each topic lands in: the `--table` template, and the import's destinations.

A routed import (`--topic-pattern REGEX`, or a `--table` that names `{topic}`, `{schema}` or
`{table}`) writes each topic into the table its template names, and each table is a
Destination of its own: its Target (layout, value schema), its topics and partitions, how its
values decode, and what its ledger holds. The import has one Spark query and one checkpoint
for all of them; what each table holds is read from that table alone (sinks/ledger.py), so a
crash between two tables' commits of one batch replays into each only what it lacks.

The names a template takes, for a topic (`table_names`, the seam the Debezium value format
fills in): `{topic}` is the topic's name; `{schema}` and `{table}` come from a Debezium
envelope's `source` block (a sample record's value), or, without one, from the topic's name
split as Debezium names its topics, `<prefix>.<schema>.<table>`. A character a table name
cannot hold (anything but letters, digits and `_`) becomes `_` in each name; the store then
checks the whole (Sink.table_name: Iceberg takes `namespace.table`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from lagless.cdc.envelope import Split, source_of, split
from lagless.exceptions import BadInput
from lagless.importer.decode import AvroDecoding
from lagless.kafka import TP, Offsets
from lagless.sinks.base import Target

V = TypeVar("V")
NAMES = ("topic", "schema", "table")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_NOT_IN_A_NAME = re.compile(r"[^A-Za-z0-9_]")


@dataclass(frozen=True)
class TableTemplate:
    """`--table` as a template: `{topic}`, `{schema}`, `{table}` are replaced per topic."""

    text: str

    @classmethod
    def parse(cls, text: str) -> TableTemplate:
        for name in _PLACEHOLDER.findall(text):
            if name not in NAMES:
                raise BadInput(
                    f"--table {text!r}: {{{name}}} is not a name it takes "
                    "({topic}, {schema}, {table})"
                )
        if "{" in _PLACEHOLDER.sub("", text) or "}" in _PLACEHOLDER.sub("", text):
            raise BadInput(f"--table {text!r} has an unmatched brace")
        return cls(text)

    @property
    def names(self) -> set[str]:
        return set(_PLACEHOLDER.findall(self.text))

    @property
    def needs_source(self) -> bool:
        """Whether the table depends on more than the topic's name: a sample record decides."""
        return bool(self.names & {"schema", "table"})

    def table_for(self, names: Mapping[str, str]) -> str:
        return _PLACEHOLDER.sub(lambda m: _NOT_IN_A_NAME.sub("_", names[m.group(1)]), self.text)

    def spelled(self, names: Mapping[str, str]) -> str:
        """The template with the names as they are: two topics it spells apart are meant
        for two tables."""
        return _PLACEHOLDER.sub(lambda m: names[m.group(1)], self.text)


def table_names(topic: str, sample_value: bytes | None, events: Split | None) -> dict[str, str]:
    """The names a template takes for `topic`, given one of its records' values (None: the
    topic has none yet). The seam of the Debezium value format (`events`: how its change
    events are read; None: the values are no change events): its envelope's `source` block
    names the schema and the table; any other value, or none, falls back on the topic's name."""
    found = envelope_source(sample_value, events) if events is not None else None
    if found is None:
        found = split_topic(topic)
    schema, table = found if found is not None else (None, None)
    names = {"topic": topic}
    if schema is not None and table is not None:
        names.update(schema=schema, table=table)
    return names


def split_topic(topic: str) -> tuple[str, str] | None:
    """(schema, table) of a topic named as Debezium names them, `<prefix>.<schema>.<table>`
    (the prefix may hold dots itself); None for a name of fewer parts."""
    parts = topic.rsplit(".", 2)
    return (parts[1], parts[2]) if len(parts) == 3 and all(parts) else None


def envelope_source(value: bytes | None, events: Split = split) -> tuple[str, str] | None:
    """(schema, table) of a Debezium change event (cdc/envelope.py reads it); a connector
    without schemas (MySQL) names its database. None when the value is not such an event."""
    source = source_of(value, events) or {}
    schema, table = source.get("schema") or source.get("db"), source.get("table")
    if isinstance(schema, str) and isinstance(table, str) and schema and table:
        return schema, table
    return None


@dataclass
class Destination:
    """One table of the import, and everything that is the table's own."""

    target: Target
    topics: tuple[str, ...]
    partitions: list[TP]
    # The table as messages name it: the store (no password) and the table.
    where: str
    avro: AvroDecoding | None = None
    # What the table's ledger holds, read once before the first batch (sinks/ledger.py).
    held: Offsets = field(default_factory=dict)
    # The template spelled with its topics' names as they are (TableTemplate.spelled): a topic
    # that appears later joins the table only if it spells it alike.
    spelled: str = ""
    # What the user is told of this table before the import runs (one line), if anything.
    warning: str | None = None
    # Why a schema change stopped the table (--schema-changes evolve): its parts of batches
    # are left out; None while it is mirrored.
    stopped: str | None = None

    def ranges_of(self, per_partition: Mapping[TP, V]) -> dict[TP, V]:
        """The part of a batch's offsets (or ranges) that is this table's."""
        return {tp: each for tp, each in per_partition.items() if tp[0] in self.topics}


def route(
    template: TableTemplate,
    topics: Iterable[str],
    names_of: Callable[[str], Mapping[str, str]],
    table_name: Callable[[str], str] = lambda name: name,
    one_topic_per_table: bool = False,
) -> dict[str, tuple[str, ...]]:
    """Each table and the topics routed into it, in order (table_name: as the store takes
    the name). Topics of a log land in one table when the template names them alike (shards
    of one log under two prefixes); a table of rows by key (a mirror, an upsert:
    `one_topic_per_table`) takes one topic's, as two sources' rows would overwrite and
    delete each other's (refuse_a_collision). Names that differ only by characters a table
    name cannot hold (`a.b` and `a_b`) would join them unasked: refused."""
    tables: dict[str, list[str]] = {}
    spelled: dict[str, dict[str, str]] = {}
    for topic in sorted(topics):
        names = names_of(topic)
        table = table_name(template.table_for(names))
        tables.setdefault(table, []).append(topic)
        spelled.setdefault(table, {}).setdefault(template.spelled(names), topic)
    for table, spellings in spelled.items():
        if len(spellings) > 1:
            refuse_a_merge(template, table, *list(spellings.values())[:2])
        if one_topic_per_table and len(tables[table]) > 1:
            refuse_a_collision(template, table, *tables[table][:2])
    return {table: tuple(named) for table, named in sorted(tables.items())}


def refuse_a_collision(template: TableTemplate, table: str, first: str, second: str) -> None:
    """BadInput: two topics, two sources of rows by key, would land in one table."""
    apart = "{topic}" if "schema" in template.names else "{schema}_{table}"
    first, second = sorted((first, second))
    raise BadInput(
        f"topics {first!r} and {second!r} would both land in table {table!r} "
        f"(--table {template.text!r}), where one's rows would overwrite and delete the "
        f"other's: name them apart, e.g. --table '{apart}', or narrow --topic-pattern"
    )


def refuse_a_merge(template: TableTemplate, table: str, first: str, second: str) -> None:
    raise BadInput(
        f"topics {first!r} and {second!r} would both land in table {table!r} "
        f"(--table {template.text!r}: characters a table name cannot hold become _); "
        "narrow --topic-pattern or name them apart"
    )


def topics_of(partitions: Iterable[TP]) -> list[str]:
    return sorted({topic for topic, _ in partitions})


def by_topic(destinations: Iterable[Destination]) -> dict[str, Destination]:
    return {topic: each for each in destinations for topic in each.topics}
