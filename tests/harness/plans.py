"""An import's plan without a broker (importer/plan.ImportPlan): the one untyped table of an import
that is not routed, its store and the write path decided for it, as `check` would make them.
For tests of what the plan gives (the source's options, the write path) that need no topic."""

from __future__ import annotations

from lagless.importer.plan import ImportPlan
from lagless.importer.routing import Destination
from lagless.importer.spec import ImportSpec
from lagless.importer.write_path import table_writer
from lagless.sinks import Target, sink_from_url
from lagless.sinks.base import Sink, TaskWriter


def offline_plan(spec: ImportSpec) -> ImportPlan:
    sink = sink_from_url(spec.sink_url)
    destination = Destination(spec.target(sink), spec.topics, [], "")
    plan = ImportPlan(spec, sink, None, [], [destination])  # type: ignore[arg-type]  # no broker
    plan.decide_write_path()
    return plan


def tasks_writer(
    spec: ImportSpec, target: Target | None = None, sink: Sink | None = None
) -> TaskWriter | None:
    """The writer the source's tasks run for the import's one table (write_path.table_writer):
    None when its records come through Spark's rows."""
    sink = sink or sink_from_url(spec.sink_url)
    return table_writer(spec.write_options, sink, target or spec.target(sink))
