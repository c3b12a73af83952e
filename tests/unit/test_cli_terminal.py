"""What the command line prints on a terminal and what in a file or a pipe: a table is whole
in a file (no cell cut, no title wrapped), and the line saying why `lag` waits is for a person
only."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from lagless.cli.lag import partitions_table
from lagless.cli.options import tell_waiting
from lagless.importer.table_lag import PartitionInTable
from lagless.lag.table import print_table

TOPIC = "shop.public.orders_of_the_eastern_region_warehouses_and_their_returns"


def _rows() -> list[PartitionInTable]:
    return [PartitionInTable(TOPIC, p, 1_000, 0, 2_000, 1_000, 12.5) for p in range(2)]


def test_a_table_in_a_file_keeps_every_topic_name_whole() -> None:
    """`lag --sink` cut topic names at 80 columns when stdout was not a terminal."""
    out = io.StringIO()
    print_table(partitions_table("orders", _rows()), Console(file=out))
    lines = out.getvalue().splitlines()
    assert sum(TOPIC in line for line in lines) == 2
    assert max(len(line) for line in lines) > 80


def test_a_title_wider_than_its_table_is_one_line() -> None:
    table = Table(title="its files, and a title far wider than the one column under it")
    table.add_column("table")
    table.add_row("orders")
    out = io.StringIO()
    print_table(table, Console(file=out))
    assert out.getvalue().splitlines()[0].strip() == table.title


def test_on_a_terminal_the_table_keeps_to_its_width() -> None:
    out = io.StringIO()
    print_table(
        partitions_table("orders", _rows()),
        Console(file=out, force_terminal=True, width=80, color_system=None),
    )
    assert max(len(line) for line in out.getvalue().splitlines()) <= 80


def test_why_lag_waits_is_said_on_a_terminal_only() -> None:
    person, pipe = io.StringIO(), io.StringIO()
    tell_waiting("sampling group g for 10 s", Console(file=person, force_terminal=True))
    tell_waiting("sampling group g for 10 s", Console(file=pipe))
    assert "sampling group g for 10 s" in person.getvalue()
    assert pipe.getvalue() == ""
