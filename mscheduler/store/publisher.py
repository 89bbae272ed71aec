"""Idempotent publish: insert unless the key exists, else decide what the caller asked for.

Part of the store layer (it writes through the store's collection and runs only queries
from `mscheduler.queries`); `Store.publisher` is its entry point.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bson import ObjectId
from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from ..encoding import check_document_size
from ..errors import ConfigurationError, StoreError, TaskRunning
from ..models import PublishResult, Task, TaskState
from ..observability import tracing
from ..queries import history as hq
from ..queries import partitions as pq
from ..queries import tasks as q
from ..queries import timing as tq
from ..specs import PublishSpec
from .driver import driver_errors
from .flows import Flows
from .partitions import Partitions

if TYPE_CHECKING:
    from .base import StoreBase

log = logging.getLogger(__name__)

_PUBLISH_ATTEMPTS = 5  # re-reads when a concurrent writer changed the task under a publish


def task_document(
    spec: PublishSpec,
    now: dt.datetime,
    *,
    depends_on: Sequence[str] = (),
    deps_pending: Sequence[str] = (),
    deps_failed: Sequence[str] = (),
    trace_context: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The new task's document of ``spec``, its dependencies as resolved by the caller (the
    one builder of a published document: `Publisher` and `batches` both use it)."""
    return q.new_task_document(
        key=spec.key,
        name=spec.name,
        payload=spec.payload,
        options=spec.options,
        now=now,
        task_id=ObjectId(),
        depends_on=depends_on,
        deps_pending=deps_pending,
        deps_failed=deps_failed,
        trace_context=trace_context,
    )


def check_fits(spec: PublishSpec, now: dt.datetime | None = None) -> dict[str, Any]:
    """The whole document of ``spec`` fits its options' budget: checked before the first
    write, with every dependency still pending (the largest the document starts as).
    Returns the document checked: for a spec without dependencies it is the document a
    publish at ``now`` writes, but for its trace context (a batch writes it as it is, rather
    than build it again)."""
    deps = spec.depends_on
    document = task_document(
        spec, now or dt.datetime.now(dt.timezone.utc), depends_on=deps, deps_pending=deps
    )
    check_document_size(document, spec.options)
    return document


class Publisher:
    """Idempotent publish and replace; driver errors become mscheduler errors here."""

    def __init__(self, store: StoreBase, flows: Flows, partitions: Partitions) -> None:
        self._store = store
        self._flows = flows
        self._partitions = partitions

    @property
    def in_transaction(self) -> bool:
        return self._store.in_transaction

    @tracing.producer("publish")  # the PRODUCER span whose context the document carries
    @driver_errors
    async def publish(self, spec: PublishSpec, turn: dt.datetime | None = None) -> PublishResult:
        """Publish ``spec``, idempotently by key (`Scheduler.publish` says what each of its
        flags does to an existing task). ``turn``: a partitioned task's turn, when the caller
        took it already (`turns`, before a batch's transaction)."""
        check_fits(spec)
        await self._store.ready()
        if spec.debounce:
            result = await self._debounce(spec, turn)
        else:
            result = await self._publish(spec, turn)
        await self._store.work_written()
        return result

    async def _publish(self, spec: PublishSpec, turn: dt.datetime | None = None) -> PublishResult:
        document = await self._document(spec, turn)
        task = await self._insert_unless_exists(document)
        if task.id == document["_id"]:
            log.info("task published", extra={"action": "task_published", "key": task.key})
            return PublishResult(task=await self._attached(task), created=True)
        for _ in range(_PUBLISH_ATTEMPTS):
            outcome = await self._publish_over(task, document, spec)
            if isinstance(outcome, PublishResult):
                if turn is None and spec.options.partition is not None and not outcome.replaced:
                    # The turn taken here placed no task: given back, so publishing a key
                    # that exists does not push its partition's next tasks back.
                    await self._partitions.untake(
                        spec.name, spec.options.partition, document["created_at"]
                    )
                return outcome
            task = outcome  # changed under us: decide again on what is there now
        raise StoreError(f"publish {task.key!r}: the task kept changing; try again")

    async def _debounce(self, spec: PublishSpec, turn: dt.datetime | None = None) -> PublishResult:
        """Publish, or, if the key waits to start, give it this payload and push its start
        back to ``options.not_before`` (set by the caller from the debounce window)."""
        result = await self._publish(spec, turn)
        if result.created or result.task.attempts or result.task.state.value not in tq.NOT_STARTED:
            return result  # new, or started (running, finished, a retry to come): as publish
        assert spec.options.not_before is not None
        # The task keeps its own options: the new payload must fit its budget, not the caller's.
        base = await self._store.collection.find_one(q.by_key(spec.key), q.GROWING_FIELDS_EXCLUDED)
        if base is not None:
            check_document_size({**base, "payload": spec.payload}, result.task.options)
        found = await self._store.collection.find_one_and_update(
            tq.debounce_filter(spec.key, spec.name),
            tq.debounce_update(spec.payload, spec.options.not_before, self._store.clock.now()),
            return_document=ReturnDocument.AFTER,
        )
        if found is None:  # it started meanwhile: as publish says
            return result
        log.info("task debounced", extra={"action": "task_debounced", "key": spec.key})
        return PublishResult(task=Task.model_validate(found), created=False, payload_updated=True)

    @tracing.producer("replace")  # the PRODUCER span whose context the document carries
    @driver_errors
    async def replace(self, spec: PublishSpec, turn: dt.datetime | None = None) -> PublishResult:
        """Publish anew over a task that is not running, as if it had been cancelled and
        published again (its waiting dependents now wait for the new one)."""
        check_fits(spec)
        await self._store.ready()
        # Tasks waiting for this key wait for the new task: its dependencies must not wait
        # for them.
        edges = [(dependency, spec.key) for dependency in spec.depends_on]
        await self._flows.refuse_cycles(edges, "replace")
        for _ in range(_PUBLISH_ATTEMPTS):
            current = await self._store.get(spec.key)
            if current is None:
                return await self.publish(spec, turn)
            if current.state is TaskState.RUNNING:
                raise TaskRunning(f"task {spec.key!r} is running; it cannot be replaced now")
            document = await self._document(spec, turn)
            query = q.replace_filter(spec.key, current.version)
            replaced = await self._replace(current, document, query)
            if replaced is not None:
                await self._store.work_written()
                return PublishResult(task=replaced, created=False, replaced=True)
        raise StoreError(f"replace {spec.key!r}: the task kept changing; try again")

    @tracing.producer("publish")  # a retry is the next run of its key, published anew
    @driver_errors
    async def rerun(self, current: Task, spec: PublishSpec) -> PublishResult | None:
        """``spec`` as the next run of ``current``, a failed or cancelled task, only if it is
        still at the version the caller read and decided on (`queries.tasks.retry_filter`);
        None if it changed meanwhile (the caller re-reads and decides again)."""
        check_fits(spec)
        await self._store.ready()
        document = await self._document(spec)
        query = q.retry_filter(spec.key, current.version)
        replaced = await self._replace(current, document, query)
        if replaced is None:
            return None
        await self._store.work_written()
        return PublishResult(task=replaced, created=False, replaced=True)

    async def _document(self, spec: PublishSpec, turn: dt.datetime | None = None) -> dict[str, Any]:
        present: list[str] = []
        pending: list[str] = []
        failed: list[str] = []
        if spec.depends_on:
            present, pending, failed = await self._flows.resolve(
                spec.key, list(spec.depends_on), spec.allow_missing
            )
        document = task_document(
            spec,
            self._store.clock.now(),
            depends_on=present,
            deps_pending=pending,
            deps_failed=failed,
            trace_context=tracing.carrier(),  # the current span: the publish's (`tracing.producer`)
        )
        if spec.options.partition is not None:
            if turn is None:
                turn = (await self._partitions.turns([spec]))[spec.key]
            pq.placed(document, turn)
        return document

    async def turns(self, specs: Sequence[PublishSpec]) -> dict[str, dt.datetime]:
        """The turns of the partitioned specs of a batch, by key (`Partitions.turns`);
        nothing is sent for a batch without a partition."""
        return await self._partitions.turns(specs)

    async def _replace(
        self, current: Task, document: dict[str, Any], query: dict[str, Any]
    ) -> Task | None:
        """Replace ``current`` (matched by ``query``, which pins its version) keeping its
        identity, its count of dependents and its history (`queries.history`: the attempts
        of its earlier runs); None if it changed meanwhile."""
        replacement = {k: v for k, v in document.items() if k != "_id"}
        replacement["version"] = current.version + 1
        replacement["dependent_count"] = current.dependent_count
        replacement.update(hq.carried_history(current, self._store.clock.now()))
        replaced = await self._store.collection.find_one_and_replace(
            query, replacement, return_document=ReturnDocument.AFTER
        )
        if replaced is None:
            return None
        log.info("task replaced", extra={"action": "task_replaced", "key": current.key})
        return await self._attached(Task.model_validate(replaced))

    async def _insert_unless_exists(self, document: dict[str, Any]) -> Task:
        upsert_filter, update = q.publish_upsert(document)
        try:
            found = await self._store.collection.find_one_and_update(
                upsert_filter, update, upsert=True, return_document=ReturnDocument.AFTER
            )
        except DuplicateKeyError:
            # A concurrent publish of the same key inserted first: that document is the task.
            found = await self._store.collection.find_one(q.by_key(document["key"]))
        if found is None:  # pragma: no cover - an upsert always returns a document
            raise StoreError(f"publish {document['key']!r}: upsert returned nothing")
        return Task.model_validate(found)

    async def _publish_over(
        self, task: Task, document: dict[str, Any], spec: PublishSpec
    ) -> PublishResult | Task:
        """Publish onto an existing task. Returns the result, or the re-read task to retry on."""
        key, update_payload, replace_finished = task.key, spec.update_payload, spec.replace_finished
        if task.state in replace_finished:
            query = q.replace_finished_filter(key, task.version)
            replaced = await self._replace(task, document, query)
            if replaced is not None:
                return PublishResult(task=replaced, created=False, replaced=True)
            return await self._reread(key)
        if task.name != document["name"]:
            raise ConfigurationError(
                f"key {key!r} already names a task of name {task.name!r}, not {document['name']!r}"
            )
        if (update_payload or replace_finished) and task.state is TaskState.RUNNING:
            raise TaskRunning(f"task {key!r} is running; it cannot be replaced or updated now")
        if update_payload and task.payload != document["payload"]:
            check_document_size(document, task.options)  # the task keeps its own options
            update_filter, update = q.update_payload(
                key, document["payload"], self._store.clock.now()
            )
            updated = await self._store.collection.find_one_and_update(
                update_filter, update, return_document=ReturnDocument.AFTER
            )
            if updated is None:
                return await self._reread(key)
            return PublishResult(
                task=Task.model_validate(updated), created=False, payload_updated=True
            )
        return PublishResult(task=task, created=False)

    async def _attached(self, task: Task) -> Task:
        """A new task with dependencies, once counted in on them (re-read: they may have
        ended meanwhile and changed it)."""
        if not task.depends_on:
            return task
        await self._flows.attach(task)
        return await self._reread(task.key)

    async def _reread(self, key: str) -> Task:
        found = await self._store.collection.find_one(q.by_key(key))
        if found is None:  # deleted in between: publishing again creates it
            raise StoreError(f"publish {key!r}: the task was deleted meanwhile; publish again")
        return Task.model_validate(found)
