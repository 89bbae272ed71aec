"""The package's layout is its architecture: layers call downward only, nothing imports in a
cycle, only the store talks to MongoDB, the faces use the public API alone. A module is sized
by its concept, not by a count of lines (a module trimmed to fit a number is worse than a
long one).

Reads the source with `ast` (imports under ``TYPE_CHECKING`` and inside functions count too:
a cycle for the type checker is a cycle for the reader)."""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Callable, Iterable, Iterator

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "mscheduler"

# Lowest first. A module may import from a lower layer, or from its own package; the
# foundation modules (models, errors, ...) may import each other, acyclically.
FOUNDATION = {
    "__about__",
    "collection",
    "reconnect_backoff",
    "retry_policy",
    "clock",
    "constants",
    "context",
    "start_delay",
    "encoding",
    "errors",
    "host_guard",
    "liveness",
    "layout",
    "models",
    "periodic",
    "specs",
    "observability",
    "worker_options",
}
LAYERS = {
    "foundation": 0,
    "queries": 1,
    "store": 2,
    "backends": 2,
    "services": 3,  # the composition root, and the process-lifetime services over the store
    "consumer": 4,
    "browse": 5,  # `Scheduler.browse`: the operator's reads, over the store
    "handlers": 5,  # the public home of what handlers use: re-exports from consumer/
    "testing": 5,
    "api": 6,
    "dashboard": 7,  # pages over the public API; the cli serves it
    "http": 7,  # the HTTP API over the public API; the cli serves it
    "sync_scheduler": 7,  # a Scheduler run from blocking code
    "__init__": 8,
    "cli": 8,
    "__main__": 9,  # python -m mscheduler: the cli
}
# The faces: what users meet (the command, the dashboard, the HTTP API, the blocking
# scheduler). They reach data only through the public API (`Scheduler`, its `browse`, and the
# public modules: models, errors, handlers, ...): never a scheduler's store, never a module of
# the layers below it.
FACES = {"dashboard", "http", "cli", "sync_scheduler"}
INTERNALS = {"store", "queries", "services", "consumer"}
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
TALKS_TO_MONGODB = {"store", "backends", "testing"}


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


def _import_lines(tree: ast.AST, package_name: str) -> Iterator[tuple[int, str]]:
    """Each module of the package a module's source imports (``package_name``: the one its
    relative imports start from), with the line of the import."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("mscheduler"):
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_name.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("mscheduler"):
                origin = node.module
            else:
                continue
            for alias in node.names:
                submodule = f"{origin}.{alias.name}"
                yield node.lineno, submodule if submodule in MODULES else origin


def _imports(module: str) -> set[str]:
    path = MODULES[module]
    return _imports_in(module, path.read_text(), package=path.name == "__init__.py")


def _imports_in(module: str, source: str, *, package: bool = False) -> set[str]:
    """The modules of the package that ``source``, as ``module``'s, imports."""
    package_name = module if package else module.rpartition(".")[0]
    targets = {target for _, target in _import_lines(ast.parse(source), package_name)}
    return {target for target in targets if target in MODULES and target != module}


GRAPH = {module: _imports(module) for module in MODULES}


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import of ``graph`` from a layer to one at or above it, in another package."""
    upward = []
    for module, targets in graph.items():
        for target in targets:
            mine, theirs = _group(module), _group(target)
            if mine == theirs:
                continue
            if LAYERS[theirs] >= LAYERS[mine]:
                upward.append(f"{module} -> {target} ({mine} may not import {theirs})")
    return sorted(upward)


def test_layers_import_downward_only():
    """No exception: the store builds no service (the composition root, `services.root`,
    builds the store and then the services over it)."""
    upward = _upward(GRAPH)
    assert not upward, "\n".join(upward)


def test_the_layer_check_sees_the_store_import_a_service():
    """Guards the guard: a store module that names a service (its finish batcher, say, even
    under ``TYPE_CHECKING``) is an upward import."""
    planted = _imports_in(
        "mscheduler.store.tasks",
        "from .flows import Flows\n"
        "if TYPE_CHECKING:\n"
        "    from ..services.finishes import FinishBatcher\n",
    )
    assert planted == {"mscheduler.store.flows", "mscheduler.services.finishes"}
    assert _upward({"mscheduler.store.tasks": planted}) == [
        "mscheduler.store.tasks -> mscheduler.services.finishes (store may not import services)"
    ]


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


def _found(
    checked: Callable[[str], bool],
    finder: Callable[[ast.AST, str], Iterable[tuple[int, str]]],
) -> list[str]:
    """``module:line what`` for each finding of ``finder`` (given a module's tree and name)
    in the modules ``checked`` keeps."""
    found = []
    for module, path in MODULES.items():
        if not checked(module):
            continue
        findings = finder(ast.parse(path.read_text()), module)
        found += [f"{module}:{line} {what}" for line, what in findings]
    return found


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
    assert "mscheduler.store.components" in GRAPH["mscheduler.services.root"]
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


# ------------------------------------------------------------ the consumer wires its parts

CONSUMER = "mscheduler.consumer.consumer"
# Above the consumer's parts: what runs several consumers at once (`Scheduler.consumers`).
RUNS_CONSUMERS = {"mscheduler.consumer.group"}


def _passes_self(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a call is handed ``self`` itself (an argument or a keyword's value): an object
    giving itself to another as its collaborator."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            values = [*node.args, *(keyword.value for keyword in node.keywords)]
            if any(isinstance(value, ast.Name) and value.id == "self" for value in values):
                found.append((node.lineno, ast.unparse(node.func)))
    return found


def _consumer_handed_over(consumer: ast.AST, graph: dict[str, set[str]]) -> list[str]:
    """Where the consumer hands itself to a call, and which part of it imports it."""
    found = [f"{CONSUMER}:{line} hands itself to {call}" for line, call in _passes_self(consumer)]
    found += [
        f"{module} imports {CONSUMER}"
        for module, targets in sorted(graph.items())
        if module.startswith("mscheduler.consumer.")
        and module not in RUNS_CONSUMERS
        and CONSUMER in targets
    ]
    return found


def test_no_part_of_the_consumer_receives_the_consumer():
    """The consumer builds its parts and wires them once, each to the narrow collaborators it
    needs: it hands itself to none (a part that held the consumer would reach every other
    part through it, and the consumer would forward for it), and no part imports it."""
    found = _consumer_handed_over(ast.parse(MODULES[CONSUMER].read_text()), GRAPH)
    assert not found, "\n".join(found)


def test_the_wiring_check_sees_the_consumer_hand_itself_over():
    planted = ast.parse(
        "class Consumer:\n"
        "    def __init__(self, store):\n"
        "        self._executor = Executor(store, freed=self)\n"
        "        self._claimer = Claimer(store.tasks, self._heap, self)\n"
        "        self._presence = Presence(store, lambda: self.running)\n"
        "        self._listener = ChangeListener(store, self._on_change)\n"
    )
    graph = {
        **GRAPH,
        "mscheduler.consumer.claimer": _imports_in(
            "mscheduler.consumer.claimer",
            "if TYPE_CHECKING:\n    from .consumer import Consumer\n",
        ),
    }
    assert _consumer_handed_over(planted, graph) == [
        f"{CONSUMER}:3 hands itself to Executor",
        f"{CONSUMER}:4 hands itself to Claimer",
        f"mscheduler.consumer.claimer imports {CONSUMER}",
    ]


# ------------------------------------------------------------ one kind of code per layer

# What only a process-lifetime service does: loop until cancelled, run a task group, sleep,
# wait for an event. The store sends a request and returns its answer; a loop over data it
# read (a graph walk, a page of names) ends with the data, and is request/response still.
SERVICE_CALLS = {"create_task_group", "TaskGroup", "sleep", "wait", "wait_until"}
# The one sleep of the store, and why it is not a service: a transaction that lost a write
# conflict is run again within the same call, after a jittered pause of milliseconds.
SERVICE_CODE_ALLOWED = {("mscheduler.store.transactions", "sleep")}


def _service_code(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a module loops until something stops it (``while True``), starts a task group,
    sleeps or waits for an event."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.While) and isinstance(node.test, ast.Constant) and node.test.value:
            found.append((node.lineno, "while True"))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in SERVICE_CALLS:
                found.append((node.lineno, name))
    return found


def test_the_store_holds_no_service_code():
    """`store/` is one method per round trip: a loop that lives as long as the process, a
    task group, a sleep or a wait belongs to `services/`."""
    found = []
    for module, path in MODULES.items():
        if _group(module) != "store":
            continue
        for line, what in _service_code(ast.parse(path.read_text())):
            if (module, what) not in SERVICE_CODE_ALLOWED:
                found.append(f"{module}:{line} {what}")
    assert not found, "\n".join(found)


def test_the_service_check_sees_a_service():
    planted = ast.parse(
        "async def serve(hub):\n"
        "    async with anyio.create_task_group() as tg:\n"
        "        while True:\n"
        "            await anyio.sleep(1)\n"
        "            await hub.changed.wait()\n"
    )
    assert sorted(_service_code(planted)) == [
        (2, "create_task_group"),
        (3, "while True"),
        (4, "sleep"),
        (5, "wait"),
    ]
    walk = ast.parse("async def walk(queue):\n    while queue:\n        queue.pop()\n")
    assert _service_code(walk) == []


# ------------------------------------------------------------ every query in queries/

# Methods whose arguments are queries (filters, updates, pipelines, projections, sorts,
# index keys): of a collection, of a change stream's owner, and pymongo's bulk operations.
QUERY_METHODS = {
    "aggregate",
    "bulk_write",
    "count_documents",
    "create_index",
    "create_indexes",
    "delete_many",
    "delete_one",
    "distinct",
    "find",
    "find_one",
    "find_one_and_delete",
    "find_one_and_replace",
    "find_one_and_update",
    "replace_one",
    "update_many",
    "update_one",
    "watch",
    "DeleteMany",
    "DeleteOne",
    "IndexModel",
    "ReplaceOne",
    "UpdateMany",
    "UpdateOne",
}
# Where queries are written, and the memory backend, which implements the server (its calls
# to mongomock carry what it was sent).
QUERIES_WRITTEN_IN = ("mscheduler.queries", "mscheduler.layout", "mscheduler.backends.memory")


def _is_query_literal(node: ast.AST) -> bool:
    """A document written in place (``{...}``), or a list of pairs (a sort, index keys)."""
    if isinstance(node, (ast.Dict, ast.DictComp)):
        return True
    return isinstance(node, (ast.List, ast.Tuple)) and any(
        isinstance(element, (ast.Tuple, ast.Dict)) for element in node.elts
    )


def _query_literals(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a module writes a query itself: a literal in the arguments of a query method,
    or a document with an operator key (``{"$in": ...}``) anywhere."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in QUERY_METHODS:
                for argument in [*node.args, *(keyword.value for keyword in node.keywords)]:
                    if any(_is_query_literal(part) for part in ast.walk(argument)):
                        found.append((node.lineno, f"{name}({ast.unparse(argument)})"))
        elif isinstance(node, ast.Dict):
            for key in node.keys:
                if isinstance(key, ast.Constant) and str(key.value).startswith("$"):
                    found.append((node.lineno, f"operator {key.value}"))
    return found


def test_every_query_is_written_in_queries():
    """Every filter, update, pipeline, projection, sort and index key the package sends comes
    from `queries/` (or the layout): a ``{"$in": ...}`` written elsewhere is a leak."""
    found = _found(
        lambda module: not module.startswith(QUERIES_WRITTEN_IN),
        lambda tree, _: _query_literals(tree),
    )
    assert not found, "\n".join(found)


def test_the_query_check_sees_a_query_written_in_place():
    planted = ast.parse(
        "async def leak(collection, names):\n"
        "    await collection.find_one({'_id': 'version'})\n"
        "    await collection.update_one(q.by_key(k), {'$set': {'a': 1}})\n"
        "    cursor = collection.find(q.ANY, sort=[('_id', 1)])\n"
        "    query = {'names': {'$in': names}}\n"
        "    await collection.update_one(*q.bump(now), upsert=True)\n"
    )
    assert sorted(line for line, _ in _query_literals(planted)) == [2, 3, 3, 4, 5]


# ------------------------------------------------------------ the layout on one page

LAYOUT = "mscheduler.layout"
INDEX_CALLS = {"IndexModel", "create_index", "create_indexes"}


def _declared_suffixes() -> set[str]:
    from mscheduler import layout

    return {value for name, value in vars(layout).items() if name.isupper() and _suffix(value)}


def _suffix(value: object) -> bool:
    return isinstance(value, str) and value.startswith(".") and value[1:].isidentifier()


def _layout_declarations(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a module declares a collection (a suffix such as ``".controls"``) or an index
    (its name or keys written in an index call, or a TTL's ``expireAfterSeconds``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and _suffix(node.value):
            found.append((node.lineno, f"collection {node.value!r}"))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name not in INDEX_CALLS:
                continue
            for keyword in node.keywords:
                named = keyword.arg == "name" and isinstance(keyword.value, ast.Constant)
                if named or keyword.arg == "expireAfterSeconds":
                    found.append((node.lineno, f"index {keyword.arg}={ast.unparse(keyword.value)}"))
            for argument in node.args:
                if any(_is_query_literal(part) for part in ast.walk(argument)):
                    found.append((node.lineno, f"index keys {ast.unparse(argument)}"))
    return found


def test_collections_and_indexes_are_declared_only_in_the_layout():
    """`mscheduler.layout` is the storage layout on one page: a collection or an index
    declared anywhere else is a second definition (the memory backend, which implements
    the server, is left out)."""
    assert {".controls", ".schedules", ".stops"} <= _declared_suffixes()
    found = _found(
        lambda module: module != LAYOUT and not module.startswith("mscheduler.backends.memory"),
        lambda tree, _: _layout_declarations(tree),
    )
    assert not found, "\n".join(found)


def test_the_layout_check_sees_a_second_declaration():
    planted = ast.parse(
        "SUFFIX = '.controls'\n"
        "ttl = IndexModel([('last_seen_at', 1)], name=TTL, expireAfterSeconds=86400)\n"
        "ok = index_model(layout.WORKERS_TTL)\n"
        "await collection.create_indexes([IndexModel(list(keys), name='finished_ttl')])\n"
    )
    assert sorted(line for line, _ in _layout_declarations(planted)) == [1, 2, 2, 4]


# ------------------------------------------------------------ one home per policy

LIVENESS = "mscheduler.liveness"
# A lease's end, as written (``ping_expire_at``) and as a worker's entry reports it.
LEASE_ENDS = {"ping_expire_at", "lease_until"}
# How long a lease or a heartbeat lasts: turned into a time, it is a deadline of liveness.
LIVENESS_LENGTHS = {"worker_timeout_ms", "heartbeat_ms", "STALE_AFTER_BEATS"}


def _attribute_or_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _liveness_judged(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a module judges a lease or a worker itself: compares a lease's end with a time
    (a test against None aside), or makes a deadline of a lease's or a heartbeat's length
    (``timedelta(milliseconds=...)`` of it)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            if all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
                continue
            if any(_attribute_or_name(o) in LEASE_ENDS for o in [node.left, *node.comparators]):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and _attribute_or_name(node.func) == "timedelta":
            parts = [part for argument in node.keywords for part in ast.walk(argument.value)]
            if any(_attribute_or_name(part) in LIVENESS_LENGTHS for part in parts):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_only_liveness_judges_a_lease_or_a_worker_dead():
    """When a lease or a worker is dead is decided in `mscheduler.liveness` alone (its
    server-side half is `queries.stages`, whose queries compare stored fields, not these
    attributes): a second copy of the rule elsewhere could judge otherwise."""
    found = _found(lambda module: module != LIVENESS, lambda tree, _: _liveness_judged(tree))
    assert not found, "\n".join(found)


def test_the_liveness_check_sees_a_second_judgement():
    planted = ast.parse(
        "def live(ws, now):\n"
        "    return ws.state == 'running' and ws.ping_expire_at > now\n"
        "def end(now, task):\n"
        "    return now + dt.timedelta(milliseconds=task.options.worker_timeout_ms)\n"
        "def stale(w):\n"
        "    return w.last_seen_at + timedelta(milliseconds=w.heartbeat_ms * 2)\n"
        "held = lease.ping_expire_at is not None\n"
        "late = timedelta(milliseconds=options.ping_interval_ms)\n"
    )
    assert [line for line, _ in _liveness_judged(planted)] == [2, 4, 6]


MODELS = "mscheduler.models"
# What a limit document counts at a time, which every face shows as it reads the limit
# (`limit ls`, the HTTP API): a reading of the document, not a decision.
MODEL_READINGS_AT_A_TIME = {"usage"}


def _judged_at_a_time(tree: ast.AST) -> list[tuple[int, str]]:
    """The functions and methods of a module that take ``now``: a judgement as of a time
    (alive, live, due, free), which is a policy of its own."""
    return sorted(
        (node.lineno, node.name)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and any(argument.arg == "now" for argument in node.args.args + node.args.kwonlyargs)
        and node.name not in MODEL_READINGS_AT_A_TIME
    )


def test_the_models_hold_documents_and_their_validation_not_policies():
    """When a worker or a lease is dead (`liveness`), a task is retried (`retry_policy`), a
    task may be claimed (`consumer.claimable`) or a limit's token asked again
    (`store.limits`) is decided in the module of its concept; `mscheduler.models` keeps the
    documents, read and validated."""
    found = _judged_at_a_time(ast.parse(MODULES[MODELS].read_text()))
    assert not found, f"{MODELS} judges as of a time in {found}"


def test_the_models_check_sees_a_policy():
    planted = ast.parse(
        "class WorkerInfo(BaseModel):\n"
        "    def judged(self, now: dt.datetime) -> WorkerInfo: ...\n"
        "class Limit(BaseModel):\n"
        "    def usage(self, now: dt.datetime) -> dict: ...\n"
        "def next_claim_for(task, worker_id, now, held=()): ...\n"
        "def check_name(name: str) -> str: ...\n"
    )
    assert _judged_at_a_time(planted) == [(2, "judged"), (5, "next_claim_for")]


# The task options that decide its retries, and the server-side builders that read them
# (inside every write's pipeline, so they stay query builders): each read once.
RETRY_OPTIONS = {
    "$options.max_unexpected_retries": {"retries_left", "out_of_retries"},
    "$options.max_tries": {"tries_left", "tries_exhausted"},
    "$options.unexpected_retry_delay_ms": {"_failure_delay_ms"},
    "$options.retry_backoff": {"<module>"},
    "$options.retry_backoff_max_ms": {"<module>"},
    "$options.retry_jitter": {"<module>"},
}
RETRY_OPTION_MODULES = {"mscheduler.queries.stages", "mscheduler.queries.retry_delay"}


def _retry_option_reads(tree: ast.AST) -> list[tuple[int, str, str]]:
    """Each read of a retry option in a query (``"$options.max_tries"``...): its line, the
    option, and the top-level function it is in (``<module>`` for none)."""
    found = []
    for statement in getattr(tree, "body", []):
        where = (
            statement.name
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef))
            else "<module>"
        )
        for node in ast.walk(statement):
            if isinstance(node, ast.Constant) and node.value in RETRY_OPTIONS:
                found.append((node.lineno, node.value, where))
    return found


def _misplaced_retry_reads(module: str, tree: ast.AST) -> list[str]:
    return [
        f"{module}:{line} reads {option} in {where}"
        for line, option, where in _retry_option_reads(tree)
        if module not in RETRY_OPTION_MODULES or where not in RETRY_OPTIONS[option]
    ]


def test_every_retry_rule_of_the_server_is_one_named_builder():
    """Whether a task is retried is decided on the server by the builders that
    `mscheduler.retry_policy` lists (`queries.stages.retries_left`, ``tries_left``, ...,
    `queries.retry_delay`): a query that reads a retry option itself is a second copy of
    the rule, which the next change to it would miss."""
    found = []
    for module, path in MODULES.items():
        found += _misplaced_retry_reads(module, ast.parse(path.read_text()))
    assert not found, "\n".join(found)
    # Guards the guard: the builders' own reads are seen, and each option is read.
    stages = _retry_option_reads(ast.parse(MODULES["mscheduler.queries.stages"].read_text()))
    assert {where for _, _, where in stages} >= {"retries_left", "tries_left"}


def test_the_retry_check_sees_a_rule_written_again():
    planted = ast.parse(
        "def claim_filter(now):\n"
        "    return {'$expr': {'$lte': [failures(), '$options.max_unexpected_retries']}}\n"
        "def retries_left():\n"
        "    return {'$lte': [failures(), '$options.max_unexpected_retries']}\n"
    )
    assert _misplaced_retry_reads("mscheduler.queries.tasks", planted) == [
        "mscheduler.queries.tasks:2 reads $options.max_unexpected_retries in claim_filter",
        "mscheduler.queries.tasks:4 reads $options.max_unexpected_retries in retries_left",
    ]
    assert _misplaced_retry_reads("mscheduler.queries.stages", planted) == [
        "mscheduler.queries.stages:2 reads $options.max_unexpected_retries in claim_filter"
    ]


@pytest.mark.parametrize(
    "package",
    [
        "mscheduler.store",
        "mscheduler.services",
        "mscheduler.services.discovery",
        "mscheduler.consumer",
        "mscheduler.queries",
    ],
)
def test_a_package_docstring_lists_every_module(package: str):
    """The list of modules is the package's map: one left out is one a reader cannot find."""
    docstring = ast.get_docstring(ast.parse(MODULES[package].read_text())) or ""
    modules = {
        module.rsplit(".", 1)[1] for module in MODULES if module.rpartition(".")[0] == package
    }
    missing = sorted(name for name in modules if f"`{name}`" not in docstring)
    assert not missing, f"{package}'s docstring does not list {missing}"


MEMORY_BACKEND = "mscheduler.backends.memory"


def _memory_internals_reached(module: str) -> set[str]:
    """The modules of the memory backend that ``module`` imports other than through its
    package (a module inside the backend may import its siblings)."""
    if module == MEMORY_BACKEND or module.startswith(MEMORY_BACKEND + "."):
        return set()
    return {target for target in GRAPH[module] if target.startswith(MEMORY_BACKEND + ".")}


def test_the_memory_backend_is_reached_only_through_its_package():
    """The emulator (a copy of mongomock's engine and our corrections to it) stays out of the
    paths a maintainer reads: the library names only what ``mscheduler.backends.memory``
    exports, so its modules can change without the rest of the library knowing."""
    reached = {module: _memory_internals_reached(module) for module in GRAPH}
    assert not {module: found for module, found in reached.items() if found}
    # Guards the guard: the package's own import of its server is an edge the check sees.
    assert f"{MEMORY_BACKEND}.server" in GRAPH[MEMORY_BACKEND]


# ------------------------------------------------------------ the faces use the public API


def _past_the_api(tree: ast.AST, module: str) -> list[tuple[int, str]]:
    """Where a face reaches past the public API: an import of a module of `INTERNALS`
    (under ``TYPE_CHECKING`` and inside functions too), or the ``store`` of a scheduler
    (``scheduler.store``, ``self._scheduler.store``)."""
    found = []
    for line, target in _import_lines(tree, module.rpartition(".")[0]):
        if target.startswith("mscheduler.") and _group(target) in INTERNALS:
            found.append((line, f"imports {target}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "store":
            found.append((node.lineno, f"reaches {ast.unparse(node)}"))
    return sorted(found)


def test_the_faces_reach_data_only_through_the_public_api():
    """The command, the dashboard, the HTTP API and `SyncScheduler` are users of the library
    like any other: what one of them needs that the API lacks is an addition to the API
    (`Scheduler.browse`, `Scheduler.in_use`, ...), which then serves every user."""
    found = _found(lambda module: _group(module) in FACES, _past_the_api)
    assert not found, "\n".join(found)


def test_the_faces_check_sees_an_internal_import():
    planted = ast.parse(
        "from ..store import browse\n"
        "from ..consumer.owner import MAX_TASKS\n"
        "if TYPE_CHECKING:\n"
        "    from ..services.task_events import TaskEvents\n"
        "def pipeline():\n"
        "    from mscheduler.queries.changes import changes_pipeline\n"
        "from ..api import Scheduler\n"
        "from ..handlers import Consumer\n"
        "from ..models import TaskPage\n"
    )
    assert _past_the_api(planted, "mscheduler.dashboard.planted") == [
        (1, "imports mscheduler.store.browse"),
        (2, "imports mscheduler.consumer.owner"),
        (4, "imports mscheduler.services.task_events"),
        (6, "imports mscheduler.queries.changes"),
    ]
    faces = {_group(module) for module in MODULES} & FACES
    assert faces == FACES  # each face is a group the check walks


def test_the_faces_check_sees_a_reach_into_the_store():
    planted = ast.parse(
        "async def page(scheduler):\n"
        "    await scheduler.store.browse.task_page()\n"
        "    await scheduler.browse.task_page()\n"
        "class Sync:\n"
        "    def wait(self, keys):\n"
        "        return self._scheduler.store.get_many(keys)\n"
    )
    assert _past_the_api(planted, "mscheduler.sync_scheduler") == [
        (2, "reaches scheduler.store"),
        (6, "reaches self._scheduler.store"),
    ]
