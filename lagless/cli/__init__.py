"""The command line. Each command is a module with `register(subparsers)`."""

import importlib
from types import ModuleType

COMMANDS = ("broker", "gen", "import_", "demo", "lag", "doctor", "simulate")


def commands() -> list[ModuleType]:
    found = []
    for name in COMMANDS:
        try:
            found.append(importlib.import_module(f"lagless.cli.{name}"))
        except ModuleNotFoundError as exc:
            if exc.name != f"lagless.cli.{name}":
                raise
    return found
