"""The documentation checks that need no broker: the site builds with no broken link, the
reference is the CLI's own help, every shell block is run by a test or says why not, and every
option a doc passes to lagless exists, spelt one way (tests/harness/docs.py has the convention)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from lagless.cli import reference
from lagless.cli.main import build_parser, command_in
from tests.harness.docs import ROOT, first_hour, pages, sh_blocks


def _parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return parser, dict(sub.choices)


def test_the_site_builds_strictly_no_broken_link_or_anchor(tmp_path: Path) -> None:
    """mkdocs.yml is strict: a link to a missing page or anchor, a page outside the nav fail."""
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr
    home = (tmp_path / "site" / "index.html").read_text()
    assert "The first hour" in home  # the home page is the README
    assert 'href="imports/"' in home  # its docs/ links made the site's


def test_the_reference_is_the_cli_own_help() -> None:
    assert reference.PAGE.read_text() == reference.render(), (
        f"docs/reference.md is stale: run {reference.REGENERATE}"
    )


def test_every_shell_block_is_run_by_a_test_or_says_why_not() -> None:
    """README's blocks outside the first hour are not run by the docs test: they must say why.
    A marker without a reason does not count."""
    unmarked = [
        block.where
        for block in sh_blocks(ROOT / "README.md")
        if not block.first_hour and block.not_run is None
    ]
    assert not unmarked, f"mark them <!-- not run: REASON --> or move them into a guide: {unmarked}"
    assert not [b.where for b in first_hour() if b.not_run], "the first hour is run whole"
    for page in pages():
        marks = re.findall(r"^\s*<!-- not run", page.read_text(), re.MULTILINE)
        assert len(marks) == sum(1 for b in sh_blocks(page) if b.not_run), (
            f"{page.name}: a <!-- not run: REASON --> marker must sit right above a ```sh block"
        )


def test_the_first_hour_is_about_ten_commands() -> None:
    steps = first_hour()
    commands = [c for step in steps for c in step.commands()]
    assert 8 <= len(steps) <= 12
    assert {c[0] for c in commands} >= {"broker", "gen", "import", "lag", "doctor", "serve"}


def test_every_option_a_doc_passes_exists_spelt_as_its_first_name() -> None:
    """`lagless X --opt` in any shell block of README.md and docs/ names an option X takes, by
    its first spelling (`--value-format`, not its alias `--format`)."""
    parser, commands = _parsers()
    wrong = []
    for page in pages():
        for block in sh_blocks(page):
            for words in block.commands():
                options = dict(_spellings(parser))
                command = command_in(words)
                if command is not None:
                    options |= dict(_spellings(commands[command]))
                else:
                    assert words == ["--help"], f"{block.where}: no command in {words}"
                for word in words:
                    name = word.split("=", 1)[0]
                    if name.startswith("--") and options.get(name) != name:
                        wrong.append(f"{block.where}: {name} (say {options.get(name)})")
    assert not wrong, wrong


def test_prose_spells_each_option_one_way() -> None:
    """Outside shell blocks too (README.md, docs/ but the generated reference): no option's
    alias where its first name is meant."""
    parser, commands = _parsers()
    aliases: dict[str, str] = {}
    for each in (parser, *commands.values()):
        aliases |= {name: first for name, first in _spellings(each) if name != first}
    found = [
        f"{page.name}: {alias} (say {first})"
        for page in pages()
        if page.name != "reference.md"
        for alias, first in aliases.items()
        if re.search(re.escape(alias) + r"(?![\w-])", page.read_text())
    ]
    assert not found, found


def _spellings(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """(each long option name, the first long name of its option)."""
    pairs = []
    for action in parser._actions:
        longs = [name for name in action.option_strings if name.startswith("--")]
        pairs += [(name, longs[0]) for name in longs]
    return pairs


def test_the_mirror_types_table_is_made_from_the_type_corpus() -> None:
    """docs/mirror.md's values per type are tests/integration/test_mirror_types.py's rules."""
    from tests.harness.type_corpus import rules_table

    text = (ROOT / "docs" / "mirror.md").read_text(encoding="utf-8")
    begin = "<!-- type corpus: made by python -m tests.harness.type_corpus -->\n"
    shown = text[text.index(begin) + len(begin) : text.index("\n<!-- end of type corpus -->")]
    assert shown == rules_table(), "rerun python -m tests.harness.type_corpus into docs/mirror.md"
