"""`lagless` command line: one module per command, each with `register(subparsers)`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from lagless.exceptions import BadInput, LaglessError, TransientError

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
# sysexits.h's EX_TEMPFAIL: something was away (a broker, a database); running the same command
# again resumes where it stopped, so a supervisor may retry on this code and alert on the others.
EXIT_TRANSIENT = 75


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus an error; bad input gets one line instead."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"lagless: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    from lagless.cli import commands

    parser = OneLineParser(
        prog="lagless",
        description="Import Kafka topics into stores with Spark, and see why a consumer lags.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for module in commands():
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BadInput as exc:
        print(f"lagless: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except TransientError as exc:
        print(f"lagless: failed, may pass on a rerun: {exc}", file=sys.stderr)
        return EXIT_TRANSIENT
    except LaglessError as exc:
        print(f"lagless: failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
