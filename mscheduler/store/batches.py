"""All-or-nothing writes of many tasks: `publish_many` and `commit` (`Store.batches`).

Everything that can be checked without writing is checked first (specs, results, keys that
name tasks of another name, missing dependencies, leases, preconditions), then the writes
run through `transactions.run_atomically`: a transaction on a replica set, and on the memory
backend a sequence that nothing can interleave. A failed check raises before anything is
written.

Without a transaction (the memory backend, a standalone server) what stays true: nothing is
written when a check fails, and on the memory backend no other coroutine sees a half-done
batch. What does not: a failure *while* writing (the network, the process dying) leaves the
writes before it in place. Each is idempotent, so publishing the batch again completes it;
a commit's completions may then be recorded without its publishes.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pymongo import UpdateOne

from .. import context
from ..collection import TasksCollection
from ..encoding import check_result
from ..errors import (
    ConfigurationError,
    DependencyError,
    LeaseLost,
    PreconditionFailed,
    TaskRunning,
)
from ..liveness import lease_is_live
from ..models import (
    Lease,
    PublishResult,
    Task,
    TaskOptions,
    TaskState,
    WorkerStateKind,
    check_key,
    checked,
)
from ..observability import tracing
from ..queries import flows as fq
from ..queries import partitions as pq
from ..queries import tasks as q
from ..specs import PublishSpec, Step, dependency_order, flatten
from .publisher import check_fits, task_document
from .transactions import run_atomically

if TYPE_CHECKING:
    from .whole import WholeStore

log = logging.getLogger(__name__)

Completion = Lease | tuple[Lease, Any]
Document = dict[str, Any]


def _checked_specs(
    specs: Step | Iterable[Step], allow_missing: bool, now: dt.datetime | None = None
) -> tuple[list[PublishSpec], dict[str, Document]]:
    """The specs in dependency order, each checked (its fields and its document's size), and
    the documents checked of those without dependencies, by key: what `_planned_documents`
    writes for them at ``now``, not built a second time."""
    ordered = [
        PublishSpec.of_task(spec, allow_missing=allow_missing)
        for spec in dependency_order(flatten(specs))
    ]
    drafts: dict[str, Document] = {}
    for spec in ordered:
        document = check_fits(spec, now)
        if not spec.depends_on:
            drafts[spec.key] = document
    return ordered, drafts


async def _check_names(
    store: WholeStore, specs: Sequence[PublishSpec], replacing: frozenset[str] = frozenset()
) -> dict[str, Task]:
    """A key that already names a task of another name is refused before the first write
    (found while writing, the specs before it would stay written where there is no
    transaction). A key being replaced may change its name. Returns the tasks that exist."""
    keys = [spec.key for spec in specs if spec.key not in replacing]
    if not keys:
        return {}
    existing = {task.key: task for task in await store.get_many(keys)}
    clashes = [
        f"{spec.key!r} names a task of name {existing[spec.key].name!r}, not {spec.name!r}"
        for spec in specs
        if spec.key in existing
        and existing[spec.key].name != spec.name
        and existing[spec.key].state not in spec.replace_finished
    ]
    if clashes:
        raise ConfigurationError(f"publish: nothing written; key {'; key '.join(clashes)}")
    return existing


async def _check_external(
    store: WholeStore, specs: Sequence[PublishSpec], allow_missing: bool
) -> None:
    in_batch = {spec.key for spec in specs}
    external = sorted({d for spec in specs for d in spec.depends_on if d not in in_batch})
    if not external or allow_missing:
        return
    found = {task.key for task in await store.get_many(external)}
    missing = [key for key in external if key not in found]
    if missing:
        raise DependencyError(f"publish_many: no task has the key(s) {missing}")


async def _publish_all(
    store: WholeStore,
    specs: Sequence[PublishSpec],
    turns: Mapping[str, dt.datetime],
    replacing: frozenset[str] = frozenset(),
) -> list[PublishResult]:
    """Publish in order; a key in ``replacing`` replaces the task of that key, continuing its
    version (a commit that deletes and publishes one key). ``turns``: the partitioned
    specs' turns, taken before the transaction (`Publisher.turns`)."""
    return [
        await store.publisher.replace(spec, turns.get(spec.key))
        if spec.key in replacing
        else await store.publisher.publish(spec, turns.get(spec.key))
        for spec in specs
    ]


async def _publish_many(
    store: WholeStore, specs: Step | Iterable[Step], allow_missing: bool
) -> list[PublishResult]:
    now = store.clock.now()  # one time for the batch: its documents share their dates
    ordered, drafts = _checked_specs(specs, allow_missing, now)
    if not ordered:
        return []
    # One PRODUCER span for the batch: each of its tasks carries this span's context.
    with tracing.publishing("publish", [spec.name for spec in ordered], count=len(ordered)):
        await store.ready()
        existing = await _check_names(store, ordered)
        await _check_external(store, ordered, allow_missing)
        replaces = _replaces(ordered, existing)
        # Partitioned tasks' turns, before (and outside) the batch's transaction: of the new
        # tasks, or, in a batch that replaces finished ones, of every spec.
        new = [spec for spec in ordered if replaces or spec.key not in existing]
        turns = await store.publisher.turns(new)

        async def write(collection: TasksCollection) -> list[PublishResult]:
            with store.bound(collection):
                if replaces:  # each spec as `publish` does it, in order: see `_replaces`
                    return await _publish_all(store, ordered, turns)
                if any(spec.depends_on for spec in ordered):
                    return await _publish_flow(store, ordered, now, drafts, turns)
                return await _publish_flat(store, ordered, existing, now, drafts, turns)

        published = await run_atomically(store.collection, write)
        await store.work_written()  # once for the batch, after its last write
        return published


def _replaces(specs: Sequence[PublishSpec], existing: Mapping[str, Task]) -> bool:
    """Whether the batch publishes anew a finished task it names (``replace_finished``).
    Such a batch is written one spec at a time, in dependency order, as `publish` writes each
    (a replaced task's dependents in the batch then wait for its new run): a round trip per
    task, paid only by a batch that replaces. A spec that would replace a running task is
    refused here, before anything is written (`TaskRunning`), as `publish` refuses it."""
    replaces = False
    for spec in specs:
        task = existing.get(spec.key)
        if task is None or not spec.replace_finished:
            continue
        if task.state is TaskState.RUNNING:
            raise TaskRunning(
                f"publish_many: nothing written; task {spec.key!r} is running, it cannot be "
                "replaced now"
            )
        replaces = replaces or task.state in spec.replace_finished
    return replaces


async def _upsert(
    store: WholeStore, documents: Mapping[str, Document], turns: Mapping[str, dt.datetime]
) -> set[str]:
    """One ordered bulk write of idempotent upserts; the keys it inserted (a key a concurrent
    publish inserted in between is matched by its upsert, not inserted again: the unique
    ``key`` index). ``turns``: the partitioned tasks' places in the claim order, taken
    before the batch's transaction (`Publisher.turns`)."""
    if not documents:
        return set()
    for key, turn in turns.items():
        if key in documents:
            pq.placed(documents[key], turn)
    order = list(documents)
    requests = [UpdateOne(*q.publish_upsert(documents[key]), upsert=True) for key in order]
    result = await store.collection.bulk_write(requests, ordered=True)
    return {order[index] for index in result.upserted_ids or {}}


async def _publish_flat(
    store: WholeStore,
    specs: Sequence[PublishSpec],
    existing: Mapping[str, Task],
    now: dt.datetime,
    drafts: Mapping[str, Document],
    turns: Mapping[str, dt.datetime],
) -> list[PublishResult]:
    """A batch without dependencies: the keys that did not exist go out as one bulk write of
    idempotent upserts (one round trip per task would make a large ``publish_many`` wait
    on the network once per task). A key a concurrent publish inserted in between is read
    back as existing."""
    documents = _planned_documents(specs, existing, now, drafts)
    created = await _upsert(store, documents, turns)
    raced = [key for key in documents if key not in created]
    found = dict(existing)
    if raced:
        found.update((task.key, task) for task in await store.get_many(raced))
    if created:
        log.info("tasks published", extra={"action": "tasks_published", "count": len(created)})
    new = _new_tasks(documents[spec.key] for spec in specs if spec.key in created)
    return [
        PublishResult(task=next(new), created=True)
        if spec.key in created
        else PublishResult(task=found[spec.key], created=False)
        for spec in specs
    ]


def _new_tasks(documents: Iterable[Document]) -> Iterator[Task]:
    """Each document as a `Task`, its options validated once for a run of documents that
    share them (a batch's usually all do): `TaskOptions` is frozen, so the tasks may share
    one, and each task is what validating its whole document gives."""
    shared: tuple[Any, Any, TaskOptions] | None = None  # options, not_before, validated
    for document in documents:
        options, not_before = document["options"], document["not_before"]
        if shared is not None and shared[0] == options and shared[1] == not_before:
            yield Task.model_validate({**document, "options": shared[2]})
            continue
        task = Task.model_validate(document)
        shared = (options, not_before, task.options)
        yield task


def _planned_documents(
    specs: Sequence[PublishSpec],
    found: Mapping[str, Task],
    now: dt.datetime,
    drafts: Mapping[str, Document],
) -> dict[str, Document]:
    """The documents of the keys that do not exist yet, decided in memory from one read:
    each spec sees its in-batch dependencies as they will be written (the specs come in
    dependency order), as publishing them one at a time would have read them. A spec
    without dependencies is written as its size was checked (``drafts``, made at ``now``)."""
    trace_context = tracing.carrier()  # the batch's span: one for every task of it
    states = {key: task.state for key, task in found.items()}
    documents: dict[str, Document] = {}
    for spec in specs:
        if spec.key in found:
            if found[spec.key].name != spec.name:
                raise ConfigurationError(
                    f"key {spec.key!r} already names a task of name "
                    f"{found[spec.key].name!r}, not {spec.name!r}"
                )
            continue
        draft = drafts.get(spec.key)
        if draft is not None:  # no dependency: nothing to resolve
            draft["trace_context"] = dict(trace_context) if trace_context else None
            documents[spec.key] = draft
            states[spec.key] = TaskState(draft["state"])
            continue
        missing = [dependency for dependency in spec.depends_on if dependency not in states]
        if missing and not spec.allow_missing:
            raise DependencyError(
                f"depends_on: no task has the key(s) {missing} (allow_missing=True to ignore)"
            )
        present = [dependency for dependency in spec.depends_on if dependency in states]
        unmet = [d for d in present if states[d] is not TaskState.SUCCESS]
        failed = [d for d in unmet if states[d] in (TaskState.FAIL, TaskState.CANCELLED)]
        document = task_document(
            spec,
            now,
            depends_on=present,
            deps_pending=[d for d in unmet if d not in failed],
            deps_failed=failed,
            trace_context=trace_context,
        )
        documents[spec.key] = document
        states[spec.key] = TaskState(document["state"])
    return documents


async def _publish_flow(
    store: WholeStore,
    specs: Sequence[PublishSpec],
    now: dt.datetime,
    drafts: Mapping[str, Document],
    turns: Mapping[str, dt.datetime],
) -> list[PublishResult]:
    """A batch with dependencies in a number of round trips that does not grow with it (one
    per task would keep a transaction open past MongoDB's limit for a large flow): one read of
    every key the batch names, the documents decided in memory, one bulk write of upserts, one
    of dependent counts, one read to catch up with dependencies that ended meanwhile, one read
    back. The documents are those of publishing each spec in order.

    Invariant (as `Flows.attach`): a new task is counted in on its dependencies *before* they
    are re-read, so a dependency that ends concurrently is either seen ended here or sees the
    count and tells the task itself (telling twice changes nothing). A key a concurrent
    publish inserted in between is matched by its upsert, not inserted again, and returned as
    existing (only without a transaction: inside one, the write conflict aborts it and the
    transaction is retried from the read)."""
    named = {spec.key for spec in specs} | {d for spec in specs for d in spec.depends_on}
    found = {task.key: task for task in await store.get_many(sorted(named))}
    documents = _planned_documents(specs, found, now, drafts)
    created = await _upsert(store, documents, turns)
    counts = Counter(d for key in created for d in documents[key]["depends_on"])
    if counts:
        await store.collection.bulk_write(
            [UpdateOne(*fq.count_dependents(key, count)) for key, count in counts.items()],
            ordered=False,
        )
    waiting = {d for key in created for d in documents[key]["deps_pending"]}
    if waiting:
        for dependency in await store.get_many(sorted(waiting)):
            if dependency.state.is_terminal:  # ended meanwhile: it may not have seen them
                await store.flows.catch_up(
                    dependency,
                    [
                        key
                        for key in sorted(created)
                        if dependency.key in documents[key]["deps_pending"]
                    ],
                )
    if created:
        log.info("tasks published", extra={"action": "tasks_published", "count": len(created)})
    if documents:
        found.update((task.key, task) for task in await store.get_many(list(documents)))
    return [PublishResult(task=found[spec.key], created=spec.key in created) for spec in specs]


async def _commit(
    store: WholeStore,
    *,
    complete: Iterable[Completion] = (),
    publish: Step | Iterable[Step] = (),
    delete: Iterable[str] = (),
    require: Mapping[str, int] | None = None,
) -> list[PublishResult]:
    """In one transaction: require that other tasks are still at the given ``version``,
    finish this worker's tasks (fenced by run_id), delete tasks, publish tasks. A key both
    deleted and published is replaced (a barrier task): its version goes on from the old
    one, so a stale ``require`` can never match the new task, and its dependents wait for
    the new one. A key only deleted fails the dependents still waiting for it (cancelled,
    naming it, unless published with ``on_dependency_failure="run"``)."""
    completions = [c if isinstance(c, tuple) else (c, None) for c in complete]
    results = [(lease, check_result(result, lease.task.options)) for lease, result in completions]
    ordered, _ = _checked_specs(publish, allow_missing=False)
    deletions = [checked(check_key, key) for key in delete]
    required = {checked(check_key, key): version for key, version in (require or {}).items()}
    replacing = frozenset(deletions) & {spec.key for spec in ordered}
    only_deleted = [key for key in deletions if key not in replacing]
    await store.ready()
    await _check_names(store, ordered, replacing)
    await _check_external(store, ordered, allow_missing=False)
    if replacing:  # a replaced key keeps its waiting dependents: no cycle through them
        edges = [(dep, spec.key) for spec in ordered for dep in spec.depends_on]
        await store.flows.refuse_cycles(edges, "commit")
    turns = await store.publisher.turns(ordered)  # before (and outside) the transaction

    async def write(collection: TasksCollection) -> list[PublishResult]:
        with store.bound(collection):
            await _check_preconditions(store, required)
            await _check_leases(store, [lease for lease, _ in results])
            existing = await _check_not_running(store, deletions, [lease for lease, _ in results])
            for lease, result in results:
                await store.tasks.succeed(lease, result)
            if only_deleted:
                deleted = await collection.delete_many(q.deletable(only_deleted))
                if deleted.deleted_count < len(existing & set(only_deleted)):
                    # Claimed since the check (only where no transaction holds the read).
                    raise TaskRunning(
                        f"commit: a task of {only_deleted} started meanwhile; it is not deleted"
                    )
                await store.flows.forget(only_deleted)
            return await _publish_all(store, ordered, turns, replacing=replacing)

    published = await run_atomically(store.collection, write)
    context.mark_completed({lease.run_id for lease, _ in results})
    await store.work_written()  # once for the commit, after its last write
    return published


async def _check_preconditions(store: WholeStore, required: Mapping[str, int]) -> None:
    if not required:
        return
    versions = {task.key: task.version for task in await store.get_many(list(required))}
    stale = [key for key, version in required.items() if versions.get(key) != version]
    if stale:
        raise PreconditionFailed(
            f"commit: these tasks changed or are gone: {stale} "
            f"(required {[required[k] for k in stale]}, found "
            f"{[versions.get(k) for k in stale]})",
            keys=stale,
        )


async def _check_not_running(
    store: WholeStore, keys: Sequence[str], completing: Sequence[Lease]
) -> set[str]:
    """A commit deletes (or deletes and publishes again) no running task, as `replace` and
    ``update_payload`` refuse one: its handler would run on with its task gone, and learn it
    only at its next ping. A task running only by the leases the commit completes is
    deletable (they end first). Read first, so the refusal writes nothing; returns the keys
    that exist."""
    if not keys:
        return set()
    completed = {lease.run_id for lease in completing}
    tasks = await store.get_many(list(keys))
    running = [
        task.key
        for task in tasks
        if task.state is TaskState.RUNNING
        and any(
            ws.state is WorkerStateKind.RUNNING and ws.run_id not in completed
            for ws in task.worker_states
        )
    ]
    if running:
        raise TaskRunning(
            f"commit: nothing written; {running} running, and a running task is not deleted "
            "or replaced (it may be once its handler finished, or cancel it first)"
        )
    return {task.key for task in tasks}


async def _check_leases(store: WholeStore, leases: Sequence[Lease]) -> None:
    """Read first, so a lost lease fails the commit before anything is written."""
    if not leases:
        return
    now = store.clock.now()
    tasks = {task.key: task for task in await store.get_many([lease.key for lease in leases])}
    for lease in leases:
        task = tasks.get(lease.key)
        live = task is not None and any(
            ws.run_id == lease.run_id and lease_is_live(ws, now) for ws in task.worker_states
        )
        if not live:
            raise LeaseLost(f"commit: worker {lease.worker_id!r} no longer holds {lease.key!r}")


class Batches:
    """All-or-nothing writes of many tasks (`Store.batches`)."""

    def __init__(self, store: WholeStore) -> None:
        self._store = store

    async def publish_many(
        self, specs: Step | Iterable[Step], *, allow_missing: bool = False
    ) -> list[PublishResult]:
        return await _publish_many(self._store, specs, allow_missing)

    async def commit(
        self,
        *,
        complete: Iterable[Completion] = (),
        publish: Step | Iterable[Step] = (),
        delete: Iterable[str] = (),
        require: Mapping[str, int] | None = None,
    ) -> list[PublishResult]:
        return await _commit(
            self._store, complete=complete, publish=publish, delete=delete, require=require
        )
