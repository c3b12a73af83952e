"""The lag table, in the columns of the field report's `stream.sh lag`: partition | lag | pos | end.

An All row of totals comes first; lagless adds the estimated time lag and the status.
"""

from __future__ import annotations

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from lagless.lag.report import LagReport, PartitionLag

COLUMNS = ("partition", "lag", "pos", "end", "lag_s", "status")
NOT_COMMITTED = "-"


def _partition_label(row: PartitionLag, single_topic: bool) -> str:
    return str(row.partition) if single_topic else f"{row.topic}:{row.partition}"


def _seconds(value: float | None) -> str:
    return "?" if value is None else f"{value:,.1f}"


def _count(value: int) -> str:
    """Thousands separated, as the dashboard and the demo print them."""
    return f"{value:,}"


def table_cells(report: LagReport, now: float) -> list[tuple[str, ...]]:
    """The All row, then one row per partition, as text in COLUMNS order; time lags as of now."""
    single_topic = len({row.topic for row in report.rows}) <= 1
    total = (
        "All",
        _count(report.total_lag),
        _count(sum(row.committed or 0 for row in report.rows)),
        _count(sum(row.end for row in report.rows)),
        _seconds(report.max_lag_seconds(now)),
        report.status.name,
    )
    rows = [
        (
            _partition_label(row, single_topic),
            _count(row.lag),
            NOT_COMMITTED if row.committed is None else _count(row.committed),
            _count(row.end),
            _seconds(row.lag_seconds(now)[0]),
            row.status.name,
        )
        for row in report.rows
    ]
    return [total, *rows]


def print_table(table: Table, console: Console | None = None) -> None:
    """A table whole: on a terminal as wide as it lets; elsewhere (a file, a pipe: no width to
    keep to) at the width its cells and title need, never a cell cut or a title wrapped."""
    console = console or Console()
    if not console.is_terminal:
        title = len(str(table.title or ""))
        table.min_width = max(table.min_width or 0, title)
        wide = console.options.update_width(100_000)
        needed = Measurement.get(console, wide, table).maximum
        console = Console(
            file=console.file, width=max(needed, title), color_system=None, force_terminal=False
        )
    console.print(table)


def rich_table(report: LagReport, now: float) -> Table:
    topics = sorted({row.topic for row in report.rows})
    table = Table(title=f"group {report.group} on {', '.join(topics)}")
    for name in COLUMNS:
        table.add_column(name, justify="left" if name in ("partition", "status") else "right")
    for cells in table_cells(report, now):
        table.add_row(*cells)
    return table


def markdown_table(report: LagReport, now: float) -> str:
    """The table as the field report pasted it; `lagless simulate --lag-table` reads it back."""
    lines = [
        "| " + " | ".join(COLUMNS) + " |",
        "| --- | " + " | ".join("---:" for _ in COLUMNS[1:-1]) + " | --- |",
    ]
    lines += ["|" + "|".join(cells) + "|" for cells in table_cells(report, now)]
    return "\n".join(lines)
