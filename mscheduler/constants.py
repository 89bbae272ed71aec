"""Defaults, bounds and the query dialect: the task options' defaults, the limits on what callers
pass in and on a task document's size, and the operators every query builder keeps to. The
storage layout (collections and indexes) is `layout`."""

from __future__ import annotations

from typing import Final

# Task option defaults: the documented ones (docs/protocol.md), also what a task published
# by another client without options is read with.
DEFAULT_PRIORITY: Final = 0
DEFAULT_CONCURRENT_WORKER_CNT: Final = 1
DEFAULT_MAX_UNEXPECTED_RETRIES: Final = 3
DEFAULT_UNEXPECTED_RETRY_DELAY_MS: Final = 10_000
DEFAULT_PING_INTERVAL_MS: Final = 30_000
DEFAULT_WORKER_TIMEOUT_MS: Final = 60_000

# Bounds on what callers pass in.
MAX_KEY_LENGTH: Final = 512
MAX_NAME_LENGTH: Final = 128
MAX_PARTITION_LENGTH: Final = 512  # TaskOptions.partition
MAX_WORKER_ID_LENGTH: Final = 256
MAX_SPECIFIC_WORKERS: Final = 1_000
MAX_CONCURRENT_WORKER_CNT: Final = 1_000
MAX_UNEXPECTED_RETRIES: Final = 1_000
MAX_TRIES: Final = 2**31 - 1  # an int32 in BSON; counted against attempts, never multiplied
MIN_PRIORITY: Final = -(2**31)  # an int32 in BSON
MAX_PRIORITY: Final = 2**31 - 1
MAX_TASKS: Final = 1_000  # the most one call of `Scheduler.own` claims
MAX_PAGE: Final = 500  # the most tasks one page of `Browse.task_page` holds
MAX_NAMES: Final = 1_000  # the most names `Browse.task_names` lists
# A failure's retry delay, before jitter: ``unexpected_retry_delay_ms`` and
# ``retry_backoff_max_ms`` at most, and what a growing delay without a maximum stops at, so no
# date computed from it can overflow (`queries.retry_delay`).
MAX_RETRY_DELAY_MS: Final = 30 * 86_400_000
# ``retry_backoff`` at most: its power, computed on the server, must stay a finite double
# (`queries.retry_delay.backoff_power` bounds the exponent for it).
MAX_RETRY_BACKOFF: Final = 10.0

# Size budget of one task document. MongoDB refuses documents over 16 MiB; a task grows after
# publish (worker states, results, errors), so publish keeps room for all it can grow by
# (`encoding.growth_reserve`), which the bounds below make finite whatever the options:
# - ``worker_states`` keeps the running and succeeded states (at most concurrent_worker_cnt
#   together), the states that ended in the latest write, and the last KEPT_FINISHED_STATES
#   others (failed, timed out, released); older ones are dropped and counted in
#   ``dropped_attempts`` / ``dropped_failures`` (kept for ever, they outgrow 16 MiB in time);
# - results share RESULTS_BYTES per task: each success may store MAX_RESULT_BYTES, or less when
#   concurrent_worker_cnt successes (plus the task's ``result`` copy) would not fit;
# - an error is at most MAX_ERROR_BYTES encoded.
MAX_DOCUMENT_BYTES: Final = 16 * 1024 * 1024
KEPT_FINISHED_STATES: Final = 20
MAX_RESULT_BYTES: Final = 1024 * 1024
RESULTS_BYTES: Final = 4 * 1024 * 1024
MAX_ERROR_TYPE_BYTES: Final = 256
MAX_ERROR_MESSAGE_BYTES: Final = 4_000
MAX_TRACEBACK_LINES: Final = 20
MAX_TRACEBACK_BYTES: Final = 8_000
MAX_ERROR_BYTES: Final = 16 * 1024  # the three above, with field names and BSON framing
# The attempts of a key's earlier runs (before a retry or a ``replace_finished`` publish ran
# it again): the last KEPT_EARLIER_ATTEMPTS in ``earlier_attempts``, without their results
# (the run's outcome is what it left behind; errors are bounded), older ones counted in
# ``earlier_dropped``.
KEPT_EARLIER_ATTEMPTS: Final = 10
# MongoDB documents "no more than 100 levels of nesting" (the top-level document is level 1;
# its source tolerates 180 for storage: maxBSONDepth 200 less 20 system levels). We keep to the
# documented limit, so a payload may nest 99 levels below the task document.
MAX_NESTING_DEPTH: Final = 100

# The format of the task documents this version writes (their ``format`` field). It reads every
# older one: a document without the field is format 1, the last release's, which wrote no
# marker. A claim never matches a newer format's document (`queries.tasks.claim_filter`), and
# a consumer leaves it to a worker of a newer version (`models.Task.newer_format`).
DOCUMENT_FORMAT: Final = 2

# Names in one query of tasks by name (claims, fetches, the expiry scan): the planner turns
# ``name $in`` x ``state $in`` (two states) into one index scan each, merged in sort order, up
# to 200 scans (internalQueryMaxScansToExplode); past that it reads every matching task and
# sorts them in memory, on every claim. More names are queried in groups of this many.
MAX_NAMES_PER_QUERY: Final = 100

# The operator vocabulary of every query builder (mscheduler.queries: tasks, lease, flows, stages),
# kept small so that MongoDB, the memory backend (mongomock) and the wire tier (mongoeco)
# evaluate each the same way; tests/unit/test_query_builders.py walks every builder against
# it and compares the engines. Known traps, kept out on purpose: $reduce, $toDate,
# $mergeObjects, arrayFilters and $$NOW (missing or wrong in mongomock); $min/$max over an
# array field (mongoeco: null); $sortArray; $graphLookup (mongoeco over the wire).
QUERY_OPERATORS: Final = frozenset(
    {"$in", "$nin", "$ne", "$lt", "$lte", "$gt", "$elemMatch", "$nor", "$or", "$size", "$expr"}
    | {"$gte"}  # only on keys: queries.browse.prefix_page_filter
    | {"$type"}  # only {"$type": "date", ...}: see queries.tasks.expired_by
)
EXPRESSION_OPERATORS: Final = frozenset(
    {
        "$add",
        "$and",
        "$arrayElemAt",
        "$concatArrays",
        "$cond",
        "$eq",
        "$filter",
        "$gt",
        "$gte",
        "$ifNull",
        "$in",
        "$let",
        "$literal",
        "$lt",
        "$lte",
        "$map",
        "$ne",
        "$or",
        "$size",
        "$slice",  # only as {"$slice": [array, -n]}, n a literal
        "$switch",
        "$max",  # only as {"$max": [expr, expr]}, of two scalars (nulls ignored everywhere)
        # Arithmetic of numbers only, never of dates: queries.retry_delay's growing delay.
        "$multiply",
        "$pow",
        "$trunc",  # only as {"$trunc": [expr]}: a whole number of milliseconds to add to a date
    }
)
UPDATE_OPERATORS: Final = frozenset({"$set", "$setOnInsert", "$inc", "$pull"})  # $set: also a stage
AGGREGATION_STAGES: Final = frozenset(
    {"$set", "$unset", "$sort", "$group"}
    | {"$match", "$unwind"}  # only in queries.tasks.held_by_worker_pipeline (the workers view)
)
# In $group only; $max and $push of scalars (nulls ignored by $max, kept by $push).
ACCUMULATORS: Final = frozenset({"$sum", "$min", "$max", "$push"})
OPERATORS: Final = (
    QUERY_OPERATORS | EXPRESSION_OPERATORS | UPDATE_OPERATORS | AGGREGATION_STAGES | ACCUMULATORS
)

# Real seconds a release may take after a stop-now (`Consumer.stop_now`, a second
# signal to ``mscheduler worker``): the user asked for an exit, so a database that does not
# answer by then leaves the lease to expire.
HURRIED_RELEASE_TIMEOUT_S: Final = 2.0

# A progress message (Lease.progress): a status line, not a log.
MAX_PROGRESS_MESSAGE = 1_000
