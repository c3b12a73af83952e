"""Dependencies run one way: cli -> importer -> source/sinks -> planner/broker access.

A package may import only the packages listed for it (and itself); a new package must be
placed here before it can be imported at all. Imports inside functions count too: a lazy
import is still a dependency."""

from __future__ import annotations

import ast
from pathlib import Path

import lagless

# Modules every layer may use: errors, failpoints, stop signals, secrets, an error's first
# line, logging, retries. They import nothing of lagless but exceptions.
FOUNDATION = {"exceptions", "failpoints", "signals", "secret", "first_line", "logs", "retry"}

ALLOWED: dict[str, set[str]] = {
    "cli": {
        "importer",
        "lag",
        "serve",
        "gen",
        "broker",
        "kafka",
        "progress",
        "sinks",
        "source",
        "scenarios",
    },
    # The field reports live: a broker, a misbehaving group, the doctor, then an import.
    "scenarios": {"importer", "lag", "kafka", "progress", "sinks"},
    "serve": {"lag", "kafka"},
    "importer": {"source", "sinks", "kafka", "planner", "progress"},
    "lag": {"kafka", "planner"},
    "gen": {"kafka"},
    "source": {"kafka", "planner"},
    "sinks": {"planner"},
    "progress": set(),
    "kafka": set(),
    "broker": set(),
    "planner": set(),
    **{name: set() for name in FOUNDATION},
}
# The public namespace (lazy, for users) and `python -m lagless` sit above everything.
TOP = {"__init__", "__main__"}

ROOT = Path(lagless.__file__).parent


def _package_of(path: Path) -> str:
    return path.relative_to(ROOT).parts[0].removesuffix(".py")


def _imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "lagless" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_every_package_has_a_place() -> None:
    packages = {_package_of(path) for path in ROOT.rglob("*.py")} - TOP
    assert packages <= set(ALLOWED), f"place these in ALLOWED: {packages - set(ALLOWED)}"


def test_no_layer_imports_a_higher_one() -> None:
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        package = _package_of(path)
        if package in TOP:
            continue
        allowed = ALLOWED[package] | FOUNDATION | {package}
        if package in FOUNDATION:
            allowed = {package, "exceptions"}
        for imported in sorted(_imported_packages(path) - allowed):
            wrong.append(f"{path.relative_to(ROOT)} imports lagless.{imported}")
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_a_wrong_import(tmp_path: Path) -> None:
    """The parser finds imports at any depth, so the test above can fail."""
    module = tmp_path / "module.py"
    module.write_text("def f():\n    from lagless.importer.job import run_import\n")
    assert _imported_packages(module) == {"importer"}
