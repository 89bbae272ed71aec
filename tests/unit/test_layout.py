"""The package's layout is its architecture: layers call downward only, nothing imports in a
cycle, only the store talks to MongoDB. A module is sized by its concept, not by a count of
lines (a module trimmed to fit a number is worse than a long one).

Reads the source with `ast` (imports under ``TYPE_CHECKING`` and inside functions count too:
a cycle for the type checker is a cycle for the reader)."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "mscheduler"

# Lowest first. A module may import from a lower layer, or from its own package; the
# foundation modules (models, errors, ...) may import each other, acyclically.
FOUNDATION = {
    "__about__",
    "backoff",
    "clock",
    "constants",
    "context",
    "delays",
    "encoding",
    "errors",
    "host_guard",
    "models",
    "periodic",
    "specs",
    "otel_metrics",
    "tracing",
    "worker_options",
}
LAYERS = {
    "foundation": 0,
    "queries": 1,
    "store": 2,
    "backends": 2,
    "consumer": 3,
    "api": 4,
    "handlers": 4,  # the public home of what handlers use: re-exports from consumer/
    "testing": 4,
    "metrics": 5,  # observes consumers and reads Scheduler.stats
    "dashboard": 5,  # pages over the Scheduler (and store.browse); the cli serves it
    "http": 5,  # the HTTP API over the Scheduler; the cli serves it
    "sync_scheduler": 5,  # a Scheduler run from blocking code
    "__init__": 6,
    "cli": 6,
    "__main__": 7,  # python -m mscheduler: the cli
}
# Collection methods called on a collection (an expression that names one): only the store,
# and the backends that make collections, do that.
COLLECTION_METHODS = {
    "aggregate",
    "bulk_write",
    "count_documents",
    "create_indexes",
    "delete_many",
    "delete_one",
    "drop_index",
    "find_one",
    "find_one_and_replace",
    "find_one_and_update",
    "index_information",
    "insert_many",
    "insert_one",
    "update_many",
    "update_one",
    "watch",
}
TALKS_TO_MONGODB = {"store", "backends"}


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _group(module: str) -> str:
    """The package a module belongs to: ``store`` for mscheduler.store.tasks, ``foundation``
    for the base modules, else the top-level module's own name."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    if parts[1] in FOUNDATION:
        return "foundation"
    return parts[1]


def _imports(module: str) -> set[str]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names if a.name.startswith("mscheduler"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("mscheduler"):
                origin = node.module
            else:
                continue
            for alias in node.names:
                submodule = f"{origin}.{alias.name}"
                targets.add(submodule if submodule in MODULES else origin)
    return {target for target in targets if target in MODULES and target != module}


GRAPH = {module: _imports(module) for module in MODULES}


def test_layers_import_downward_only():
    upward = []
    for module, targets in GRAPH.items():
        for target in targets:
            mine, theirs = _group(module), _group(target)
            if mine == theirs:
                continue
            if LAYERS[theirs] >= LAYERS[mine]:
                upward.append(f"{module} -> {target} ({mine} may not import {theirs})")
    assert not upward, "\n".join(sorted(upward))


def test_no_import_cycle():
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                cycle = [*path[path.index(target) :], target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)


def test_only_the_store_calls_the_collection():
    outside = []
    for module, path in MODULES.items():
        if _group(module) in TALKS_TO_MONGODB:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in COLLECTION_METHODS
                and "collection" in ast.unparse(node.func.value)
            ):
                outside.append(f"{module}:{node.lineno} calls .{node.func.attr}()")
    assert not outside, "\n".join(outside)


def test_the_checks_see_the_imports_they_judge():
    """Guards the guard: a parser that found no edge would pass everything above."""
    assert "mscheduler.queries.tasks" in GRAPH["mscheduler.store.tasks"]
    assert "mscheduler.store.tasks" in GRAPH["mscheduler.consumer.consumer"]
    assert "mscheduler.store.base" in GRAPH["mscheduler.store.flows"]  # under TYPE_CHECKING
    assert _group("mscheduler.models") == "foundation"


def _private_names_defined(tree: ast.AST) -> set[str]:
    """The private names a module's classes define: methods and ``self._x = ...``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


STORE_PRIVATE = set().union(
    *(
        _private_names_defined(ast.parse(path.read_text()))
        for module, path in MODULES.items()
        if _group(module) == "store"
    )
)


def _private_reaches(tree: ast.AST, own: set[str]) -> list[tuple[int, str]]:
    """Where a module reaches a private name of the store's objects through anything but
    ``self`` or ``cls`` (``store._ready()``, ``self._store._ready()``), unless the module
    defines that name itself (a class of its own, as ``view._finishes`` in `TaskStore`)."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in STORE_PRIVATE
            and node.attr not in own
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_module_reaches_a_private_name_of_the_store_s_objects():
    """Private names stay in their module: what another module needs is a public method of
    the component that owns it. ``backends.memory`` is left out: it wraps mongomock's own
    internals (whose private names, such as ``_store``, are not the store's)."""
    reaches = []
    for module, path in MODULES.items():
        if module.startswith("mscheduler.backends.memory"):
            continue
        tree = ast.parse(path.read_text())
        for line, text in _private_reaches(tree, _private_names_defined(tree)):
            reaches.append(f"{module}:{line} reaches {text}")
    assert not reaches, "\n".join(reaches)


def test_the_private_check_sees_a_reach_into_the_store():
    """Guards the guard: the reaches this check was written for are found."""
    assert "_indexes_ready" in STORE_PRIVATE and "_finishes" in STORE_PRIVATE
    caller = ast.parse("async def f(store):\n    await store._finish_write()\n")
    assert _private_reaches(caller, _private_names_defined(caller)) == [(2, "store._finish_write")]
    helper = ast.parse("class P:\n    async def g(self):\n        await self._store._lost()\n")
    assert _private_reaches(helper, _private_names_defined(helper)) == [(3, "self._store._lost")]
