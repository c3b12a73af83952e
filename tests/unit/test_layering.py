"""Dependencies run one way: cli -> importer -> source/sinks -> planner/broker access.

A package may import only the packages listed for it (and itself); a new package must be
placed here before it can be imported at all; and no two packages depend on each other, however
far round (lagless.X imports lagless.Y, which imports ... lagless.X). Imports inside functions
and under TYPE_CHECKING count as much as those at a module's top: a lazy import is still a
dependency, and moving an import into a function hides a cycle from Python, not from this
test. A cycle is broken by moving the code both sides need, not the import."""

from __future__ import annotations

import ast
from pathlib import Path

import lagless

# Modules every layer may use: errors, failpoints, stop signals, secrets, an error's first
# line, logging, retries, the partition's type, the types a task decodes. They import nothing
# of lagless but exceptions.
FOUNDATION = {
    "exceptions",
    "failpoints",
    "signals",
    "secret",
    "first_line",
    "logs",
    "retry",
    "partitions",
    "decodable_types",
}

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
    "importer": {"source", "sinks", "kafka", "planner", "progress", "cdc"},
    "lag": {"kafka", "planner"},
    "gen": {"kafka"},
    "source": {"kafka", "planner"},
    "sinks": {"planner", "cdc"},
    # Debezium's change events: the envelope's rules and Kafka Connect's types, pure.
    "cdc": set(),
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
            if node.module == "lagless":  # `from lagless import logs`: the module logs
                names = [f"lagless.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "lagless" and len(parts) > 1 and _is_package(parts[1]):
                found.add(parts[1])
    return found


def _is_package(name: str) -> bool:
    """A package or a module of lagless (not a name of its public namespace)."""
    return (ROOT / name).is_dir() or (ROOT / f"{name}.py").is_file()


def _package_graph() -> dict[str, set[str]]:
    """Each package (or top-level module) and the others it imports."""
    graph: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        package = _package_of(path)
        if package not in TOP:
            graph.setdefault(package, set()).update(_imported_packages(path) - {package} - TOP)
    return graph


def _a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph, as the packages round it (the first one again at the end)."""
    done: set[str] = set()

    def walk(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for following in sorted(graph.get(node, ())):
            found = walk(following, [*path, node])
            if found is not None:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        found = walk(start, [])
        if found is not None:
            return found
    return None


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


def test_no_packages_depend_on_each_other() -> None:
    cycle = _a_cycle(_package_graph())
    assert cycle is None, "packages import each other: " + " -> ".join(cycle or [])


def test_the_allowed_layers_have_no_cycle() -> None:
    """The table above is the intended design: it may not allow a cycle either."""
    cycle = _a_cycle({package: set(allowed) for package, allowed in ALLOWED.items()})
    assert cycle is None, "ALLOWED lets packages import each other: " + " -> ".join(cycle or [])


def test_the_check_sees_a_cycle() -> None:
    """A cycle three packages long is found, so the tests above can fail."""
    graph = {"cli": {"importer"}, "importer": {"sinks", "kafka"}, "sinks": {"cli"}, "kafka": set()}
    assert _a_cycle(graph) == ["cli", "importer", "sinks", "cli"]
    assert _a_cycle({"cli": {"importer"}, "importer": {"kafka"}, "kafka": set()}) is None


# Module cycles not yet broken, each a set of modules: the test below fails on any other, and
# on one of these once it is gone (then remove it here).
KNOWN_MODULE_CYCLES: list[set[str]] = []


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_graph() -> dict[str, set[str]]:
    """Each module of lagless and the modules it imports (`from lagless.a import b` imports
    the module a.b when there is one, else a), lazy imports included; the public namespace
    (lagless/__init__.py) left out."""
    modules = {_module_name(path): path for path in ROOT.rglob("*.py")}
    modules.pop("", None)

    def module_of(dotted: str) -> str:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                base = node.module.removeprefix("lagless").lstrip(".")
                if not node.module.startswith("lagless"):
                    continue
                for alias in node.names:
                    whole = f"{base}.{alias.name}".lstrip(".")
                    found.add(whole if whole in modules else module_of(base))
            elif isinstance(node, ast.Import):
                found.update(
                    module_of(alias.name.removeprefix("lagless").lstrip("."))
                    for alias in node.names
                    if alias.name.startswith("lagless.")
                )
        graph[name] = found - {name, ""}
    return graph


def _module_cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected parts of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for following in sorted(graph.get(node, ())):
            if following not in index:
                visit(following)
                low[node] = min(low[node], low[following])
            elif following in stack:
                low[node] = min(low[node], index[following])
        if low[node] == index[node]:
            part = set()
            while True:
                popped = stack.pop()
                part.add(popped)
                if popped == node:
                    break
            if len(part) > 1:
                cycles.append(part)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_modules_import_each_other() -> None:
    """Within a package too: a module cycle hides behind a lazy import, and tangles what a
    reader must hold in mind at once."""
    cycles = _module_cycles(_module_graph())
    new = [sorted(cycle) for cycle in cycles if cycle not in KNOWN_MODULE_CYCLES]
    assert not new, f"modules import each other: {new}"
    gone = [sorted(cycle) for cycle in KNOWN_MODULE_CYCLES if cycle not in cycles]
    assert not gone, f"these cycles are broken: remove them from KNOWN_MODULE_CYCLES: {gone}"


def test_the_module_check_sees_a_cycle() -> None:
    assert _module_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_every_task_writer_is_a_function_of_an_executor_side_module() -> None:
    """The source's tasks run writers it names as text (executor_write.TASK_WRITERS: the source
    may not import the stores or the importer): each is a top-level function of a module
    that exists, in a package whose code runs in the tasks. An import seen as text here is a
    dependency the package rules above would otherwise miss."""
    from lagless.source.executor_write import ROUTED_WRITER, TASK_WRITERS

    assert ROUTED_WRITER in TASK_WRITERS
    for name in sorted(TASK_WRITERS):
        module, _, function = name.partition(":")
        parts = module.split(".")
        assert parts[0] == "lagless" and parts[1] in {"sinks", "importer", "source"}, name
        path = ROOT.joinpath(*parts[1:])
        file = (
            path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__init__.py"
        )
        assert file.is_file(), f"{name}: no module {module}"
        defined = {
            node.name
            for node in ast.parse(file.read_text()).body
            if isinstance(node, ast.FunctionDef | ast.ClassDef)
        }
        assert function in defined, f"{name}: {module} defines no {function}"
