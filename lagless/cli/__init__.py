"""The command line. Each command is a module with `register(subparsers)`."""

import importlib
from types import ModuleType

# Command name: its module. A command's module imports what it runs (Spark, pyarrow, matplotlib,
# database drivers): only the one asked for is imported (main.build_parser).
COMMANDS = {
    "broker": "broker",
    "gen": "gen",
    "import": "import_",
    "demo": "demo",
    "lag": "lag",
    "maintain": "maintain",
    "doctor": "doctor",
    "serve": "serve",
    "simulate": "simulate",
    "debezium": "debezium",
}


def command_module(name: str) -> ModuleType:
    return importlib.import_module(f"lagless.cli.{COMMANDS[name]}")
