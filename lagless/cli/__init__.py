"""The command line. Each command is a module with `register(subparsers)`."""

import importlib
from types import ModuleType

COMMANDS = ("broker", "gen", "import_", "demo", "lag", "doctor", "serve", "simulate")


def commands() -> list[ModuleType]:
    return [importlib.import_module(f"lagless.cli.{name}") for name in COMMANDS]
