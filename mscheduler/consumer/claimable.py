"""When this worker might claim a task, as the consumer sees it: the client-side half of the
claim filter (`queries.tasks.claim_filter`), used only to decide what to try and when; the
claim itself re-checks everything atomically on the server."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Collection

from .. import constants as c
from ..liveness import lease_is_live
from ..models import CLAIMABLE_STATES, Task, WorkerStateKind

log = logging.getLogger(__name__)

# The newer formats this process has logged that it leaves (one line each, not one per task).
_LEFT_FORMATS: set[int] = set()


def next_claim_for(
    task: Task, worker_id: str, now: dt.datetime, held: Collection[str] = ()
) -> dt.datetime | None:
    """When ``worker_id`` might claim ``task`` (None: not as things stand). ``held``: the
    run_ids the caller runs now.

    A live state of ``worker_id`` that the caller does not hold is a previous life's (a
    restart under the same id): like any lease, it ends at its expiry, which no write
    announces, so it gives a time to try again, never None (the task would wait for some
    unrelated write for ever).

    A task of a newer document format is never ours (`Task.newer_format`): said once per
    format in the process's log."""
    if task.newer_format:
        if task.format not in _LEFT_FORMATS:
            _LEFT_FORMATS.add(task.format)
            log.warning(
                "task %r is in document format %d, newer than this version of mscheduler "
                "reads (%d): left to workers of a newer version; upgrade this worker",
                task.key,
                task.format,
                c.DOCUMENT_FORMAT,
                extra={"action": "newer_format", "key": task.key, "format": task.format},
            )
        return None
    if task.state not in CLAIMABLE_STATES or task.deps_pending:
        return None
    if task.options.specific_worker_ids and worker_id not in task.options.specific_worker_ids:
        return None
    when = task.next_claim_at
    for ws in task.worker_states:
        if ws.worker_id != worker_id:
            continue
        live = lease_is_live(ws, now)
        if ws.state is WorkerStateKind.SUCCESS or (live and ws.run_id in held):
            return None
        if live and ws.ping_expire_at is not None:
            # The claim refuses a worker its second live state of a task, whichever life
            # holds the first: claimable by us once that one expires.
            when = ws.ping_expire_at if when is None else max(when, ws.ping_expire_at)
    return when
