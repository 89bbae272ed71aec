"""Every query shape the store sends is served by a declared index.

The memory backend also enforces this at run time (``notablescan``) in every test; this file
names each query explicitly, so a new query without an index fails here by name."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from bson import ObjectId

from mscheduler import layout
from mscheduler.backends.memory.index_plan import bounded_keys, implies_partial, index_serves
from mscheduler.queries import browse as bq
from mscheduler.queries import flows as fq
from mscheduler.queries import lease as lq
from mscheduler.queries import schedules as sq
from mscheduler.queries import tasks as q
from mscheduler.queries import timing as eq

NOW = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)

QUERY_SHAPES: dict[str, tuple[dict[str, Any], list[tuple[str, int]] | None]] = {
    "publish upsert": (q.publish_upsert({"key": "k"})[0], None),
    "get by key": (q.by_key("k"), None),
    "replace finished": (q.replace_finished_filter("k", 3), None),
    "update payload": (q.update_payload("k", {}, NOW)[0], None),
    "claim next": (q.claim_filter("w", NOW, names=["a", "b"]), q.CLAIM_SORT),
    "claim next, not a running key": (
        q.claim_filter("w", NOW, names=["a"], exclude_keys=["k"]),
        q.CLAIM_SORT,
    ),
    "claim by key": (q.claim_filter("w", NOW, key="k"), None),
    "lease write": (lq.lease_filter("k", "w", "r", NOW), None),
    "cancel": (q.cancel_filter("k"), None),
    "get many, lost leases": (q.by_keys(["a", "b"]), None),
    "consumer fetch": (q.fetch_filter(["a", "b"], "w1"), q.FETCH_SORT),
    "poll, due tasks of a name": (q.due_filter("a", NOW, ["w1"]), q.FETCH_SORT),
    "poll, waited keys that ended": (q.terminal_of(["a", "b"]), None),
    "set options": (q.options_filter("k"), None),
    "dependents waiting": (fq.dependents_waiting_on("k"), None),
    "unnotified": (fq.unnotified(), None),
    "unnotified dependents": (fq.unnotified_dependents_of("k"), None),
    "mark notified": (fq.mark_notified("k", NOW)[0], None),
    "add dependency": (fq.add_dependency_filter("k"), None),
    "count dependent": (fq.count_dependent(["a"])[0], None),
    # The dashboard: pages of the task list, its names, a task's links, the chart's counts.
    "page by key prefix": (bq.prefix_page_filter("mail:", None, "fail", None), bq.KEY_ORDER),
    "next page by key prefix": (bq.prefix_page_filter("m", "a", None, "m1"), bq.KEY_ORDER),
    "page in claim order": (bq.claim_order_page_filter(["a"], ["pending"], None), q.CLAIM_SORT),
    "next page in claim order": (
        bq.claim_order_page_filter(["a", "b"], ["pending", "fail"], (0, NOW, ObjectId())),
        q.CLAIM_SORT,
    ),
    "task names": (bq.name_after_filter("a"), bq.NAME_ORDER),
    "dependents": (bq.dependents_filter("k"), None),
    "finished in a bucket": (bq.finished_filter("success", NOW, NOW), None),
    "expiry scan": (eq.expired(["a", "b"], NOW), None),
}


@pytest.mark.parametrize("shape", QUERY_SHAPES)
def test_query_is_served_by_a_declared_index(shape: str):
    query, sort = QUERY_SHAPES[shape]
    serving = [
        name
        for name, keys, options in layout.TASK_INDEXES
        if index_serves(keys, query, sort, partial=options.get("partialFilterExpression"))  # type: ignore[arg-type]
    ]
    assert serving, f"no declared index serves {shape}: {query} sort {sort}"


@pytest.mark.parametrize(
    ("shape", "index"),
    [
        ("page by key prefix", "key_unique"),
        ("next page by key prefix", "key_unique"),
        ("page in claim order", "claim_order_v2"),
        ("next page in claim order", "claim_order_v2"),
        ("task names", "claim_order_v2"),
    ],
)
def test_each_page_of_the_task_list_is_selected_and_sorted_by_one_index(shape: str, index: str):
    query, sort = QUERY_SHAPES[shape]
    keys = dict((name, keys) for name, keys, _ in layout.TASK_INDEXES)[index]
    assert index_serves(keys, query, sort)


def test_the_unfiltered_task_list_walks_the_id_index_newest_first():
    for after in (None, ObjectId()):
        assert index_serves((("_id", 1),), bq.newest_page_filter(after), bq.NEWEST_ORDER)


def test_claim_next_uses_the_claim_order_index():
    query, sort = QUERY_SHAPES["claim next"]
    keys = dict((name, keys) for name, keys, _ in layout.TASK_INDEXES)["claim_order_v2"]
    assert index_serves(keys, query, sort)


@pytest.mark.parametrize(
    ("keys", "query", "sort", "served"),
    [
        ((("a", 1),), {"a": 1}, None, True),
        ((("a", 1),), {"b": 1}, None, False),
        ((("a", 1), ("b", 1)), {"a": 1}, [("b", -1)], True),
        ((("a", 1), ("b", 1)), {"a": {"$gt": 1}}, [("b", 1)], False),
        ((("a", 1), ("b", -1), ("c", 1)), {"a": 1}, [("b", -1), ("c", -1)], False),
        ((("a", 1), ("b", -1), ("c", 1)), {"a": 1}, [("b", 1), ("c", -1)], True),
        ((("_id", 1),), {}, [("_id", 1)], True),
    ],
)
def test_index_serves_follows_equality_sort_range(keys, query, sort, served):
    assert index_serves(keys, query, sort) is served


def test_the_expiry_scan_is_bounded_by_name_state_and_date():
    """Bounded on name and state alone, every consumer's housekeeping would read every task
    of its names not started (the backlog) to find the few past their expiry."""
    query = eq.expired(["a", "b"], NOW)
    usable = [
        bounded_keys(keys, query)
        for _, keys, options in layout.TASK_INDEXES
        if implies_partial(query, options.get("partialFilterExpression"))  # type: ignore[arg-type]
    ]
    assert ["name", "state", "options.expires_at"] in usable


def test_a_partial_index_is_used_only_by_queries_that_imply_its_filter():
    partial = {"options.expires_at": {"$type": "date"}}
    assert implies_partial({"options.expires_at": {"$type": "date", "$lte": NOW}}, partial)
    assert not implies_partial({"options.expires_at": {"$lte": NOW}}, partial)


def _builder_filters() -> dict[str, dict[str, Any]]:
    """Every filter a query builder makes (alone, or as the filter of a filter-update pair),
    found by the walk of `test_query_builders`: a new builder is checked here by itself."""
    from tests.unit.test_query_builders import BUILT, as_probe

    filters = {}
    for builder, built in BUILT.items():
        kind, sent = as_probe(builder, built)
        if kind == "find":
            filters[builder] = sent
        elif kind == "update" and isinstance(built, tuple):
            filters[builder] = sent[0]
    return filters


BUILDER_FILTERS = _builder_filters()
SORTS = {
    "tasks.claim_filter": q.CLAIM_SORT,
    "tasks.candidate_filter": q.CLAIM_SORT,
    "tasks.fetch_filter": q.FETCH_SORT,
    "schedules.of_names": sq.NEXT_SORT,
}
# A clause of other filters, never sent alone (claim_filter, timing.expired).
FRAGMENTS = {"tasks.expired_by"}
ID_INDEX: layout.Index = ("_id_", (("_id", 1),), {})
# The indexes of each collection a builder module's filters go to.
INDEXES_OF: dict[str, list[layout.Index]] = {
    "limits": [ID_INDEX],
    "schedules": [ID_INDEX, *layout.SCHEDULE_INDEXES],
}
TASK_INDEXES = [ID_INDEX, *layout.TASK_INDEXES]


@pytest.mark.parametrize("builder", sorted(set(BUILDER_FILTERS) - FRAGMENTS))
def test_every_builder_filter_is_served_by_a_declared_index(builder: str):
    query = BUILDER_FILTERS[builder]
    sort = SORTS.get(builder)
    indexes = INDEXES_OF.get(builder.split(".")[0], TASK_INDEXES)
    serving = [
        name
        for name, keys, options in indexes
        if index_serves(keys, query, sort, partial=options.get("partialFilterExpression"))  # type: ignore[arg-type]
    ]
    assert serving, f"no declared index serves {builder}: {query} sort {sort}"


def test_the_expiry_read_seeks_on_the_expiry_time():
    """Not only on name and state: every waiting task of those names would be examined."""
    query = eq.expired(["a"], NOW)
    keys = dict((name, keys) for name, keys, _ in layout.TASK_INDEXES)["expiry"]
    assert keys[-1][0] == "options.expires_at" and index_serves(keys, query)


@pytest.mark.parametrize("names", [["a", "b"], None])
def test_the_polling_read_of_recent_writes_seeks_on_the_write_time(names: list[str] | None):
    """A process without change streams reads the writes since its last poll, once a second:
    served by a name prefix alone, it would examine every task of those names, the finished
    ones included, on every poll. Seeking on ``updated_at`` examines the interval's writes."""
    query = q.changed_since(NOW, names)
    assert any(
        bounded_keys(keys, query)[:1] == ["updated_at"] for _, keys, _ in layout.TASK_INDEXES
    ), f"no declared index seeks on updated_at for {query}"
