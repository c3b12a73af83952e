"""docs/reference.md: every command's `--help`, as the command line prints it.

    python -m lagless.cli.reference            # rewrite docs/reference.md
    python -m lagless.cli.reference --check    # exit 1 when it is stale (tests/unit/test_docs.py)

The help is formatted at a fixed width, so the page does not depend on the terminal it was
generated in.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

WIDTH = 100
PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference.md"
REGENERATE = "python -m lagless.cli.reference"

INTRO = f"""# Reference

Every command's `--help`, generated from the command line itself (`{REGENERATE}` rewrites
this page; a test fails when it is stale). The guides say what the options are for:
[imports](imports.md), [stores](stores.md), [typed values](typed-values.md),
[lag and serve](lag-and-serve.md), [operations](operations.md). "The first failure" to "the
fifth" in the help texts are the five failures the README lists, each replayed by `lagless demo
--scenario 000` to `004` ([the five failures, live](lag-and-serve.md#the-five-failures-live)).
"""


def _help(parser: argparse.ArgumentParser) -> str:
    parser.formatter_class = functools.partial(parser.formatter_class, width=WIDTH)  # type: ignore[call-arg]
    return parser.format_help().rstrip()


def render() -> str:
    """The page: lagless's own options, then a section per command, in the order of `--help`."""
    from lagless.cli.main import build_parser

    parser = build_parser()
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sections = [INTRO, f"## lagless\n\n```text\n{_help(parser)}\n```\n"]
    for name, command in commands.choices.items():
        sections.append(f"## lagless {name}\n\n```text\n{_help(command)}\n```\n")
    return "\n".join(sections)


def main(argv: list[str]) -> int:
    page = render()
    if argv == ["--check"]:
        if PAGE.read_text() == page:
            return 0
        print(f"{PAGE} is stale: run {REGENERATE}", file=sys.stderr)
        return 1
    PAGE.write_text(page)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
