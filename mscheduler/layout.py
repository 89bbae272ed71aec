"""The storage layout on one page: every collection mscheduler writes, and every index on
each, TTL indexes included. Nothing else in the package names a collection or an index
(`tests/unit/test_layout.py` refuses a second declaration).

Collections: the tasks (``<collection>``, by default `DEFAULT_COLLECTION` in
`DEFAULT_DATABASE`), and beside them, in the same database, collections named after it plus a
suffix (``tasks.schedules``...). Each index is ``(name, keys, options)``; every query in
`mscheduler.queries` is served by one of them (the tests run the memory backend with a
``notablescan`` check that refuses any query none serves).
"""

from __future__ import annotations

import datetime as dt
from typing import Final

Keys = tuple[tuple[str, int], ...]
Index = tuple[str, Keys, dict[str, object]]

DEFAULT_DATABASE: Final = "mscheduler"
DEFAULT_COLLECTION: Final = "tasks"

# ------------------------------------------------------------ the collections beside the tasks

SCHEDULES: Final = ".schedules"  # schedule documents (`store.schedules`)
PAUSED: Final = ".paused"  # paused names (`store.pauses`)
LIMITS: Final = ".limits"  # limits and their slots (`store.limits`)
WORKERS: Final = ".workers"  # the live workers (`store.workers`)
STOPS: Final = ".stops"  # remote stops of a worker (`store.stops`)
# One document, the control version, bumped by every control write (`store.controls`).
CONTROLS: Final = ".controls"
# One document, the signal: bumped by writes that may give a polling process work, while one
# polls (`store.signal`); read by `_id` between polls where the server has no change streams.
SIGNAL: Final = ".signal"
# One document per name and partition: where its next task's turn in the claim order is
# (`store.partitions`, `queries.partitions`); written by publishes of partitioned tasks only.
PARTITIONS: Final = ".partitions"
# What operators write beside the tasks: `StoreBase.in_use` looks in these. The control
# version and the signal are left out, being only the echo of other writes.
BESIDE_SUFFIXES: Final = (SCHEDULES, PAUSED, LIMITS, WORKERS, STOPS)

# ------------------------------------------------------------ the tasks' indexes

TASK_INDEXES: Final[tuple[Index, ...]] = (
    # Idempotent publish and every per-task write: publishing a key twice never makes two tasks.
    ("key_unique", (("key", 1),), {"unique": True}),
    # claim_next: equality on name and state, sort by priority (high first), age and _id (ties
    # of one batch stay FIFO), range on next_claim_at (Equality-Sort-Range order). Named
    # apart from "claim_order", the same keys without _id, which no query uses: a database
    # that holds it may drop it.
    (
        "claim_order_v2",
        (
            ("name", 1),
            ("state", 1),
            ("options.priority", -1),
            ("created_at", 1),
            ("_id", 1),
            ("next_claim_at", 1),
        ),
        {},
    ),
    # In claim_order_v2, ``created_at`` is a task's place in its name's claim order: its
    # publish time, or for a task with a partition its turn (`queries.partitions`; its
    # publish time is then ``published_at``, which only partitioned tasks carry). The head of
    # a name and priority's claim order, read as a partitioned task is published, is served
    # by it too.
    # The consumer's fetcher: tasks of some names that are or will become claimable, by time.
    ("claim_time", (("name", 1), ("state", 1), ("next_claim_at", 1)), {}),
    # A claim whose reply was lost is looked up by the run_id the worker generated for it.
    ("run_id", (("worker_states.run_id", 1),), {}),
    # Flows: the dependents of a task, and finished tasks whose dependents were not told.
    ("dependents", (("depends_on", 1),), {}),
    ("dependents_notified", (("dependents_notified", 1),), {}),
    # Expiry: the tasks of some names, not started, whose expires_at has passed. Bounded on
    # all three (Equality-Range), and only tasks that have an expiry are in it, so the
    # consumers' housekeeping reads the tasks due to expire, not the whole backlog. The
    # query names the type (``$type: date``), which implies the partial filter.
    (
        "expiry",
        (("name", 1), ("state", 1), ("options.expires_at", 1)),
        {"partialFilterExpression": {"options.expires_at": {"$type": "date"}}},
    ),
    # Operating: `purge` of finished tasks by age; the failed tasks of a name (`retry`); the
    # running tasks, on its ``state`` prefix (what each worker holds: the workers view).
    ("finished", (("state", 1), ("finished_at", 1)), {}),
    # Without change streams, a process (its discovery hub, a watch) reads the writes since its
    # last poll each interval: seeking on the write time examines that interval's writes, not
    # every task of the names. Every write stamps ``updated_at``, pings included (their
    # pipeline recomputes it, and a progress report rides on them): each running task's entry
    # moves once per ping interval, and the poll reads it again then.
    ("changes", (("updated_at", 1), ("_id", 1)), {}),
)

# Optional TTL index (`ensure_indexes(finished_ttl=...)`, which gives its expireAfterSeconds):
# MongoDB deletes finished tasks this long after they ended and their dependents were told
# (``settled_at``); running and pending tasks, and finished ones whose dependents wait to be
# told, have it null and stay. On ``finished_at`` it could delete a task whose dependents
# were not told yet, and they would stay blocked.
FINISHED_TTL_INDEX: Final = "finished_ttl"
FINISHED_TTL: Final[Index] = (FINISHED_TTL_INDEX, (("settled_at", 1),), {})

# ------------------------------------------------------------ the indexes beside the tasks

# Schedules: the due schedules of some names (`queries.schedules.due_filter`).
SCHEDULE_INDEXES: Final[tuple[Index, ...]] = (("name_next_at", (("name", 1), ("next_at", 1)), {}),)

# A stale worker's document, and a stop request nobody took, are deleted by MongoDB's TTL
# monitor this long after they were last written, so crashed workers do not accumulate.
FORGET_AFTER: Final = dt.timedelta(days=1)
_FORGET_SECONDS: Final = int(FORGET_AFTER.total_seconds())
WORKERS_TTL: Final[Index] = (
    "last_seen_ttl",
    (("last_seen_at", 1),),
    {"expireAfterSeconds": _FORGET_SECONDS},
)
# A partition's document is forgotten a day after it last took turns (its next task's turn
# then starts again at the head of the claim order, `queries.partitions`).
PARTITIONS_TTL: Final[Index] = (
    "seen_ttl",
    (("seen_at", 1),),
    {"expireAfterSeconds": _FORGET_SECONDS},
)
STOPS_TTL: Final[Index] = (
    "requested_ttl",
    (("requested_at", 1),),
    {"expireAfterSeconds": _FORGET_SECONDS},
)
