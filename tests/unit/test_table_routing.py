"""Routing without Spark or a broker: the `--table` template, the names a topic gives it (the
topic's own, or a Debezium envelope's `source` block), the tables topics land in, what a
routed checkpoint remembers, and tasks of one topic each."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lagless.cdc.envelope import split
from lagless.exceptions import BadInput
from lagless.importer.checkpoint import Fit, check_fit, write_fit
from lagless.importer.routing import (
    TableTemplate,
    envelope_source,
    route,
    split_topic,
    table_names,
)
from lagless.importer.spec import ImportSpec
from lagless.kafka.config import KafkaConfig
from lagless.planner.pack import pack_tasks_per_topic
from lagless.planner.ranges import OffsetRange
from lagless.sinks import sink_from_url
from lagless.sinks.base import check_identifier
from lagless.source.executor_write import ROUTED_WRITER, RoutedWriter, routed


def test_the_template_replaces_each_name_and_makes_it_a_table_name() -> None:
    template = TableTemplate.parse("cdc_{schema}_{table}")
    names = table_names("dbserver1.inventory.order-lines", None, None)
    assert names == {"topic": "dbserver1.inventory.order-lines", "schema": "inventory",
                     "table": "order-lines"}  # fmt: skip
    assert template.table_for(names) == "cdc_inventory_order_lines"
    assert TableTemplate.parse("{topic}").table_for({"topic": "a.b-c"}) == "a_b_c"
    # A dot in the template itself stays: Iceberg's namespace.table.
    assert TableTemplate.parse("{schema}.{table}").table_for(names) == "inventory.order_lines"


@pytest.mark.parametrize(
    ("text", "complaint"),
    [("t_{name}", r"\{name\} is not a name it takes"), ("t_{topic", "unmatched brace")],
)
def test_a_template_of_unknown_names_or_braces_is_refused(text: str, complaint: str) -> None:
    with pytest.raises(BadInput, match=complaint):
        TableTemplate.parse(text)


def test_schema_and_table_come_from_the_topic_name_when_no_envelope_says() -> None:
    assert split_topic("prefix.with.dots.public.users") == ("public", "users")
    assert split_topic("public.users") is None
    assert split_topic("a..b") is None
    assert table_names("orders", None, None) == {"topic": "orders"}


def test_a_debezium_envelope_names_the_schema_and_table_with_or_without_its_schema() -> None:
    payload = {"before": None, "after": {"id": 1}, "op": "c",
               "source": {"schema": "sales", "table": "customers", "db": "shop"}}  # fmt: skip
    with_schema = json.dumps({"schema": {"type": "struct"}, "payload": payload}).encode()
    assert envelope_source(with_schema) == ("sales", "customers")
    assert envelope_source(json.dumps(payload).encode()) == ("sales", "customers")
    mysql = {**payload, "source": {"db": "shop", "table": "customers"}}
    assert envelope_source(json.dumps(mysql).encode()) == ("shop", "customers")
    assert envelope_source(b"not json") is None
    assert envelope_source(b'{"id": 1}') is None
    assert envelope_source(None) is None
    # The envelope wins over the topic's name, for the debezium value format only.
    topic = "server.public.renamed"
    assert table_names(topic, with_schema, split)["table"] == "customers"
    assert table_names(topic, with_schema, None)["table"] == "renamed"
    assert table_names(topic, None, split)["table"] == "renamed"


def test_topics_whose_names_differ_only_by_what_a_table_cannot_hold_are_refused() -> None:
    template = TableTemplate.parse("{topic}")
    assert route(template, ["a", "c"], lambda topic: {"topic": topic}) == {
        "a": ("a",),
        "c": ("c",),
    }
    with pytest.raises(BadInput, match=r"'a\.b' and 'a_b' would both land in table 'a_b'"):
        route(template, ["a.b", "a_b", "c"], lambda topic: {"topic": topic})
    by_table = TableTemplate.parse("{schema}_{table}")
    with pytest.raises(BadInput, match="would both land in table 'x_y_z'"):
        route(by_table, ["p.x-y.z", "p.x.y_z"], lambda topic: table_names(topic, None, None))
    # The same names under two prefixes: shards of one table, as the template asks.
    shards = route(by_table, ["eu.s.t", "us.s.t"], lambda topic: table_names(topic, None, None))
    assert shards == {"s_t": ("eu.s.t", "us.s.t")}
    # A table of rows by key takes one topic's: two schemas' tables of one name refused.
    by_name = TableTemplate.parse("{table}")
    names = lambda topic: table_names(topic, None, split)  # noqa: E731
    with pytest.raises(BadInput) as refused:
        route(by_name, ["p.other.items", "p.public.items"], names, one_topic_per_table=True)
    assert str(refused.value).startswith(
        "topics 'p.other.items' and 'p.public.items' would both land in table 'items'"
    )
    assert "--table '{schema}_{table}'" in str(refused.value)
    with pytest.raises(BadInput, match=re.escape("e.g. --table '{topic}'")):
        route(by_table, ["eu.s.t", "us.s.t"], names, one_topic_per_table=True)
    # The store's name for it: a table name the store refuses is refused here.
    with pytest.raises(BadInput, match="not a valid identifier"):
        route(template, ["9lives"], lambda topic: {"topic": topic}, check_identifier)


def spec(topics: tuple[str, ...] = (), **options: object) -> ImportSpec:
    kafka = KafkaConfig("127.0.0.1:9")
    return ImportSpec(kafka, topics, "sqlite:///x.db", "ckpt", **options)  # type: ignore[arg-type]


def test_an_import_is_routed_by_a_pattern_or_a_table_template_only() -> None:
    assert spec(topic_pattern="cdc\\..*").routed
    assert spec(topics=("a", "b"), table="t_{topic}").routed
    assert not spec(topics=("a",)).routed
    assert not spec(topics=("a", "b"), table="all").routed
    with pytest.raises(BadInput, match="--table '\\{topic\\}'"):
        spec(topics=("a", "b")).target(sink_from_url("sqlite:///x.db"))


def test_a_checkpoint_remembers_the_pattern_and_the_template(tmp_path) -> None:
    checkpoint = str(tmp_path / "ckpt")
    made = Fit.of((), "sqlite:////x.db", "{topic}", "append", "raw", pattern="cdc\\..*")
    write_fit(checkpoint, made)
    (tmp_path / "ckpt" / "offsets").mkdir()
    (tmp_path / "ckpt" / "offsets" / "0").write_text('v1\n{}\n{"cdc.a": {"0": 5}}')
    assert check_fit(checkpoint, made) is False
    other_pattern = Fit.of((), "sqlite:////x.db", "{topic}", "append", "raw", pattern="x.*")
    with pytest.raises(BadInput, match="made for --topic-pattern cdc"):
        check_fit(checkpoint, other_pattern)
    other_template = Fit.of((), "sqlite:////x.db", "t_{topic}", "append", "raw", pattern="cdc\\..*")
    with pytest.raises(BadInput, match="made for --table \\{topic\\}, not t_\\{topic\\}"):
        check_fit(checkpoint, other_template)
    named = Fit.of(("cdc.a",), "sqlite:////x.db", "{topic}", "append", "raw")
    with pytest.raises(BadInput, match=r"made for --topic \(none\), not cdc\.a"):
        check_fit(checkpoint, named)


def test_a_record_written_before_routing_still_fits_as_it_did(tmp_path) -> None:
    """lagless.json of a single-topic checkpoint, as a lagless before routing wrote it."""
    (tmp_path / "ckpt").mkdir()
    old = {"version": 1, "topics": ["orders"], "sink": "sqlite:////x.db", "table": "orders",
           "write": "append", "value_format": "raw", "key_fields": []}  # fmt: skip
    (tmp_path / "ckpt" / "lagless.json").write_text(json.dumps(old))
    (tmp_path / "ckpt" / "offsets").mkdir()
    (tmp_path / "ckpt" / "offsets" / "0").write_text('v1\n{}\n{"orders": {"0": 5}}')
    same = Fit.of(("orders",), "sqlite:////x.db", "orders", "append", "raw")
    assert check_fit(str(tmp_path / "ckpt"), same) is False


def test_an_adopted_checkpoint_of_topics_the_pattern_does_not_match_is_refused(tmp_path) -> None:
    """A checkpoint without lagless.json (an earlier lagless): its offsets' topics decide."""
    (tmp_path / "ckpt" / "offsets").mkdir(parents=True)
    (tmp_path / "ckpt" / "offsets" / "0").write_text('v1\n{}\n{"cdc.a": {"0": 5}, "x": {"0": 1}}')
    wanted = Fit.of((), "sqlite:////x.db", "{topic}", "append", "raw", pattern="cdc\\..*")
    with pytest.raises(BadInput, match="--topic x, which --topic-pattern"):
        check_fit(str(tmp_path / "ckpt"), wanted)


pieces = st.lists(
    st.builds(
        OffsetRange,
        st.sampled_from(["a", "b", "c"]),
        st.integers(0, 3),
        st.integers(0, 1000),
        st.integers(0, 1000),
    ).filter(lambda r: r.end >= r.start),
    max_size=20,
).map(lambda rs: list({(r.topic, r.partition): r for r in rs}.values()))


@given(pieces, st.integers(1, 5000))
def test_tasks_per_topic_read_one_topic_each_and_every_piece_once(
    ranges: list[OffsetRange], min_task_bytes: int
) -> None:
    tasks = pack_tasks_per_topic(ranges, min_task_bytes)
    assert all(len({piece.topic for piece in task}) == 1 for task in tasks)
    assert sorted(p for task in tasks for p in task) == sorted(r for r in ranges if r.records)
    weights = [sum(p.records for p in task) for task in tasks]
    assert weights == sorted(weights, reverse=True)


def test_a_routed_task_writes_with_its_topics_writer_only() -> None:
    writer = routed({"routes": {"a": ["json:loads", "{}"]}})
    assert isinstance(writer, RoutedWriter) and ROUTED_WRITER.endswith(":routed")
    with pytest.raises(Exception, match="topic 'b' has no table"):
        writer.write([OffsetRange("b", 0, 0, 1)], iter([]))
    with pytest.raises(Exception, match="read topics"):
        writer.write([OffsetRange("a", 0, 0, 1), OffsetRange("b", 0, 0, 1)], iter([]))
