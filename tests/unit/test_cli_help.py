"""Every command says what it does and every option has a help text (`lagless X --help`)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from lagless.cli.main import build_parser, command_in


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_command_has_a_description() -> None:
    missing = [name for name, parser in _commands().items() if not parser.description]
    assert not missing


def test_every_option_has_help() -> None:
    missing = [
        f"{name} {'/'.join(action.option_strings) or action.dest}"
        for name, parser in _commands().items()
        for action in parser._actions
        if not action.help and not isinstance(action, argparse._HelpAction)
    ]
    assert not missing, missing


def test_an_option_several_commands_take_says_the_same_everywhere() -> None:
    """Declared once (cli/options.py): same name, same help."""
    helps: dict[str, set[str | None]] = {}
    for parser in _commands().values():
        for action in parser._actions:
            for option in action.option_strings:
                helps.setdefault(option, set()).add(action.help)
    shared = (
        *("--bootstrap", "--kafka-option", "--cluster-name", "--retention-warning"),
        *("--target-file-size", "--keep-history"),
    )
    assert {option: len(helps[option]) for option in shared} == dict.fromkeys(shared, 1)


def test_the_command_is_found_past_lagless_own_options() -> None:
    assert command_in(["import", "--topic", "demo"]) == "import"
    assert command_in(["--log-level", "debug", "--log-file", "lag", "doctor"]) == "doctor"
    assert command_in(["--log-json", "--", "lag"]) == "lag"
    assert command_in(["--log-file=x", "serve", "--help"]) == "serve"
    assert command_in(["--help"]) is None
    assert command_in(["imprt"]) is None  # argparse names the choices


def test_a_command_imports_what_it_runs_only() -> None:
    """`lagless import` does not wait for the demo's and the simulator's imports (matplotlib,
    pandas: half a second before anything else happens)."""
    probe = (
        "import sys; from lagless.cli.main import build_parser, command_in; "
        "build_parser(command_in(['import', '--topic', 't'])); print(*sys.modules)"
    )
    loaded = set(
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.split()
    )
    assert "lagless.cli.import_" in loaded
    assert not loaded & {"matplotlib", "pandas", "lagless.cli.demo", "lagless.scenarios"}


def _options() -> list[tuple[str, argparse.Action]]:
    parser = build_parser()
    found = [("lagless", a) for a in parser._actions]
    found += [(name, a) for name, sub in _commands().items() for a in sub._actions]
    return [
        (name, a)
        for name, a in found
        if a.option_strings and not isinstance(a, argparse._HelpAction)
    ]


def test_every_value_has_a_metavar_of_one_style() -> None:
    """Upper case, no underscores (N, S, URL, KEY=VALUE): not argparse's MAX_RECORD_BYTES."""
    odd = [
        f"{name} {action.option_strings[0]} {action.metavar}"
        for name, action in _options()
        if action.nargs != 0
        and not action.choices
        and (
            not isinstance(action.metavar, str)
            or action.metavar != action.metavar.upper()
            or "_" in action.metavar
        )
    ]
    assert not odd, odd


def test_every_default_is_said_one_way() -> None:
    """An option with a default says it, as `(default: X)` (or `default: X` inside its
    parentheses); never `(2)` or `(default 2)`."""
    odd = []
    for name, action in _options():
        text = action.help or ""
        shown = text % {"default": action.default} if "%(default)" in text else text
        has_default = action.default not in (None, False, [], argparse.SUPPRESS)
        if has_default and "default: " not in shown:
            odd.append(f"{name} {action.option_strings[0]}: no default said: {shown}")
        if re.search(r"default [^:]|\(\d[\d.,]*\)", shown.replace("defaults", "")):
            odd.append(f"{name} {action.option_strings[0]}: {shown}")
    assert not odd, "\n".join(odd)


def _texts() -> dict[str, str]:
    """Every help text: lagless's and each command's description and options."""
    parser = build_parser()
    found = {"lagless": parser.description or ""}
    for name, command in [("lagless", parser), *_commands().items()]:
        found[f"{name} description"] = command.description or ""
        for action in command._actions:
            if action.help and action.option_strings:
                found[f"{name} {action.option_strings[-1]}"] = action.help
    return found


DOCS = Path(__file__).resolve().parents[2] / "docs"


def _anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, as the docs site (and GitHub) make them."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_page_a_help_text_points_to_exists_with_its_section() -> None:
    """`--spark-conf` pointed to "README: Cluster deployment", which lives in
    docs/operations.md: a pointer names a page, and a section of it that is there."""
    wrong = []
    pointers = 0
    for where, text in _texts().items():
        assert "README:" not in text, f"{where}: point to a page of docs/, not a README section"
        for page, anchor in re.findall(r"docs/([\w-]+\.md)(?:#([\w-]+))?", text):
            pointers += 1
            if not (DOCS / page).is_file():
                wrong.append(f"{where}: docs/{page} does not exist")
            elif anchor and anchor not in _anchors(DOCS / page):
                wrong.append(f"{where}: docs/{page} has no section #{anchor}")
    assert not wrong, "\n".join(wrong)
    assert pointers >= 4  # the check reads the help texts' pointers


def test_help_speaks_the_users_words() -> None:
    """No names from lagless's own history (the field reports it was built from), no machine
    of its development; noida-db, which the scenarios need, is said what it is."""
    odd = []
    for where, text in _texts().items():
        flat = " ".join(text.split())
        if re.search(r"field report|/work/|/home/|/root/", flat, re.IGNORECASE):
            odd.append(f"{where}: {flat}")
        if "noida-db" in flat and "noida-db (a" not in flat:
            odd.append(f"{where}: noida-db unexplained: {flat}")
    assert not odd, "\n".join(odd)


def test_a_read_only_command_offers_no_maintenance_option() -> None:
    """`lag` reads: `--target-file-size` would do nothing there."""
    offered = {
        name: {option for action in parser._actions for option in action.option_strings}
        for name, parser in _commands().items()
    }
    for command in ("lag", "doctor", "serve"):
        assert not offered[command] & {"--target-file-size", "--keep-history"}, command
    assert "--target-file-size" in offered["import"] and "--target-file-size" in offered["maintain"]
