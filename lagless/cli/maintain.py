"""`lagless maintain`: one round of table maintenance, then exit: the small files of a Parquet,
Delta or Iceberg table merged, versions older than --keep-history expired and the files only
they read removed (docs/maintenance.md). For tables a batch import or another writer fills; a
continuous import maintains its own tables between batches."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from lagless.cli.options import add_maintenance_arguments, not_empty
from lagless.exceptions import TransientError
from lagless.importer.maintenance import maintain_once
from lagless.sinks.maintenance import Policy


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "maintain", help="compact and expire a table's files once", description=__doc__
    )
    parser.add_argument(
        "--sink",
        required=True,
        metavar="URL",
        help="parquet:///dir | delta:///dir | iceberg:///dir, or their +s3:// forms",
    )
    parser.add_argument(
        "--table",
        type=not_empty,
        metavar="TABLE",
        help="the table, with its _dlq, _tombstones and _moves (default: every table of the store)",
    )
    add_maintenance_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print what was done as JSON")
    parser.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    policy = Policy(args.target_file_size, args.keep_history)
    rounds = maintain_once(args.sink, args.table, policy)
    if args.json:
        print(json.dumps([done.as_json() for done in rounds], indent=2))
    else:
        console = Console()
        for done in rounds:
            console.print(done.text())
    skipped = [done.table for done in rounds if done.conflicted]
    if skipped:
        raise TransientError(
            f"{', '.join(skipped)}: other writers kept changing them during maintenance, the "
            "other tables were maintained; a rerun maintains them"
        )
    return 0
