"""Limits per task name (``<collection>.limits``, one document per name): the updates, pure.

A document ``{_id: name, rate, per_ms, max_running, partition_max_running, starts: [{id,
until}], slots: [{id, until, partition}]}``: a start counts until ``until``, a slot until its
lease ends; a slot with a ``partition`` counts in that partition too (`bind_partition`). A
claim of that name first takes a token here, in one conditional update that is atomic on
this document: it succeeds only while fewer than ``rate`` starts are live (``until`` still
ahead) and fewer than ``max_running`` slots are. Expired entries are pruned by the same
write, so both arrays stay bounded by the limits themselves.

A start is taken before its handler starts (a claim's reply and the hand-over to the handler
come between), so it is taken *held*: it counts for ``per_ms`` plus ``hold_ms``, and a handler
starting within ``hold_ms`` of it lies inside it whatever the delay. As the handler starts,
its worker `confirm`s it: the start then counts until ``per_ms`` after the confirmation (never
longer than held), which is after the handler's start.

Invariant: a handler of a limited name starts only under a start taken here (a claim's
token, or `start` for a local retry or a late handler) no earlier than the start was taken
and no later than ``hold_ms`` after it, and each start counts from when it was taken until
``per_ms`` after its handler started; so in any window of ``per_ms`` at most ``rate`` handlers
start (the last start taken among ``rate + 1`` in one window would have found the others
counting), and at most ``max_running`` run at once (a slot lives while its run does: the
holder extends it, a crashed holder's expires with its lease). A token whose claim found
nothing is given back; a worker that dies in between, or before its confirmation, leaves it
counting until it expires: the limit errs on the safe side.

A slot leaves the document only with its run (released, given back) or by expiring (pruned by
a later write): removing a limit keeps the document, its limits null (`remove_limit`), so a
limit set again finds the slots its running tasks hold, whatever the order in which consumers
learn of the two changes. Only a document with a limit is one (`limited`).

Clocks: ``now`` is the acquiring worker's clock (`$$NOW` is missing on the memory engine,
mongomock), so a worker whose clock runs δ ahead of another's ends that one's starts δ
early. With the workers' clocks within δ of each other, at most ``rate`` start in any
``per_ms - δ``; the bound on δ is the one leases already assume
(`liveness.expiry_margin`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from .stages import Document, Pipeline, literal


def _live(field: str, now: dt.datetime) -> Document:
    """The entries of ``field`` that still count at ``now``."""
    return {
        "$filter": {
            "input": {"$ifNull": [f"${field}", []]},
            "as": "s",
            "cond": {"$gt": ["$$s.until", now]},
        }
    }


def _within(limit: str, field: str, now: dt.datetime) -> Document:
    """No ``limit`` set, or fewer live entries than it allows."""
    return {
        "$or": [
            {"$eq": [{"$ifNull": [f"${limit}", None]}, None]},
            {"$lt": [{"$size": _live(field, now)}, f"${limit}"]},
        ]
    }


def _held_start(token: str, now: dt.datetime, hold_ms: int) -> Document:
    """A start taken at ``now``, held: it counts for ``per_ms`` and ``hold_ms`` more, until
    its handler's start confirms it. A name without a rate counts none (its entry is born
    expired, and pruned by the next write)."""
    counts = {"$cond": [{"$eq": [{"$ifNull": ["$per_ms", None]}, None]}, 0, hold_ms]}
    return {
        "id": literal(token),
        "until": {"$add": [now, {"$ifNull": ["$per_ms", 0]}, counts]},
    }


def acquire(
    name: str, token: str, now: dt.datetime, until: dt.datetime, hold_ms: int
) -> tuple[Document, Pipeline]:
    """Take a held start and a slot for ``name``, if its limits allow one now; the slot lives
    until ``until`` (the lease's expiry) unless extended."""
    allowed = {"$and": [_within("rate", "starts", now), _within("max_running", "slots", now)]}
    start = _held_start(token, now, hold_ms)
    update = {
        "$set": {
            "starts": {"$concatArrays": [_live("starts", now), [start]]},
            "slots": {
                "$concatArrays": [_live("slots", now), [{"id": literal(token), "until": until}]]
            },
        }
    }
    return {"_id": name, "$expr": allowed}, [update]


def start(name: str, token: str, now: dt.datetime, hold_ms: int) -> tuple[Document, Pipeline]:
    """Take one more held start for ``name`` (a local retry of a handler whose slot is held,
    or a handler that starts too late for its claim's), if its rate allows one now."""
    entry = _held_start(token, now, hold_ms)
    update = {"$set": {"starts": {"$concatArrays": [_live("starts", now), [entry]]}}}
    return {"_id": name, "$expr": _within("rate", "starts", now)}, [update]


def confirm(name: str, tokens: Sequence[str], now: dt.datetime) -> tuple[Document, Pipeline]:
    """The handlers of these held starts have started (by ``now``): each counts until
    ``per_ms`` from ``now``, never longer than it was held."""
    return {"_id": name}, [{"$set": {"starts": _confirmed(tokens, now)}}]


def _confirmed(tokens: Sequence[str], now: dt.datetime) -> Document:
    confirmed = {"$add": [now, {"$ifNull": ["$per_ms", 0]}]}
    until = {"$cond": [{"$lt": [confirmed, "$$s.until"]}, confirmed, "$$s.until"]}
    return _until(tokens, "starts", until)


def _until(tokens: Sequence[str], field: str, until: Any) -> Document:
    """The entries of ``field`` (starts or slots), those of ``tokens`` now lasting until
    ``until`` (an expression over the entry, ``$$s``, or a time)."""
    return {
        "$map": {
            "input": {"$ifNull": [f"${field}", []]},
            "as": "s",
            "in": {
                "$cond": [
                    {"$in": ["$$s.id", literal(list(tokens))]},
                    {"id": "$$s.id", "until": until},
                    "$$s",
                ]
            },
        }
    }


def started(
    name: str,
    tokens: Sequence[str],
    leases: Mapping[str, dt.datetime],
    now: dt.datetime,
    partitions: Mapping[str, str] | None = None,
) -> tuple[Document, Pipeline]:
    """As leases are handed to workers that start their work at once (`Scheduler.own`): the
    held starts ``tokens`` confirmed (`confirm`), and each slot of ``leases`` (its token, the
    lease's run_id, to its lease's end) living exactly as long as its lease, whatever life it
    was taken with, and counting in its task's partition (``partitions``, `extend`): one
    write."""
    fields: Document = {"slots": _slots_until(leases, partitions)}
    if tokens:
        fields["starts"] = _confirmed(tokens, now)
    return {"_id": name}, [{"$set": fields}]


def _slots_until(
    untils: Mapping[str, dt.datetime], partitions: Mapping[str, str] | None = None
) -> Document:
    """The slots, those of ``untils`` (token -> time) now lasting until their time (a slot
    that counts in a partition still does). ``partitions``: the partition each run's task
    has, where its slot counts from now (`adopt`)."""
    partitions = partitions or {}

    def partition(token: str) -> Any:
        return literal(partitions[token]) if token in partitions else "$$s.partition"

    branches = [
        {
            "case": {"$eq": ["$$s.id", literal(token)]},
            "then": {"id": "$$s.id", "until": until, "partition": partition(token)},
        }
        for token, until in untils.items()
    ]
    return {
        "$map": {
            "input": {"$ifNull": ["$slots", []]},
            "as": "s",
            "in": {"$switch": {"branches": branches, "default": "$$s"}} if branches else "$$s",
        }
    }


def give_back(name: str, token: str) -> tuple[Document, Document]:
    """A token whose claim found nothing: neither a start nor a slot was used."""
    return {"_id": name}, {"$pull": {"starts": {"id": token}, "slots": {"id": token}}}


def adopt(
    name: str,
    untils: Mapping[str, dt.datetime],
    partitions: Mapping[str, str] | None = None,
) -> tuple[Document, Pipeline]:
    """Runs that started before their name was limited take slots, whatever the limit: they
    run already, and claims count them from now on. ``untils``: each run's token (its
    run_id) and when its lease ends. Idempotent: a run whose slot is there already (adopted
    by its holder and by the limit's writer, in either order) keeps one, lasting until the
    time given now. ``partitions``: the partition of each run's task that has one, in which
    its slot counts (whatever ``partition_max_running`` allows: it runs already).

    Invariant: a run adopted with its partition counts in it afterwards, whether its slot
    was there already or not: a slot taken under an earlier limit (a ``max_running`` or a
    ``rate``, whose claims count no partition) is counted in its partition as the
    ``partition_max_running`` appears, so the runs already going fill their partitions."""
    now_live = {"$ifNull": ["$slots", []]}
    entries = [
        {"id": token, "until": until, "partition": (partitions or {}).get(token)}
        for token, until in untils.items()
    ]
    missing = {
        "$filter": {
            "input": literal(entries),
            "as": "e",
            "cond": {
                "$eq": [
                    {
                        "$size": {
                            "$filter": {
                                "input": now_live,
                                "as": "s",
                                "cond": {"$eq": ["$$s.id", "$$e.id"]},
                            }
                        }
                    },
                    0,
                ]
            },
        }
    }
    slots = {"$concatArrays": [_slots_until(untils, partitions), missing]}
    return {"_id": name}, [{"$set": {"slots": slots}}]


def release(name: str, token: str) -> tuple[Document, Document]:
    """The task ended: its slot frees; its start still counts in the window."""
    return {"_id": name}, {"$pull": {"slots": {"id": token}}}


def extend(
    name: str,
    untils: Mapping[str, dt.datetime],
    partitions: Mapping[str, str] | None = None,
) -> tuple[Document, Pipeline]:
    """The holders still run: each slot of ``untils`` (token -> time) lives until its time,
    its lease's end (later or sooner than before: a slot lives as long as its lease).
    ``partitions``: the partition of each run's task that has one, where its slot counts.

    Invariant: the slot of a run of a partitioned task counts in its partition from the
    write that binds it to its lease (this one, `started`, or `bind_partition`) at the
    latest: a claim whose token was taken before its name counted partitions, landing after
    the limit's writer read what runs (`adopt`), runs already and counts as those do; it is
    never left uncounted for its whole run."""
    return {"_id": name}, [{"$set": {"slots": _slots_until(untils, partitions)}}]


def set_limit(
    name: str,
    rate: int | None,
    per_ms: int | None,
    max_running: int | None,
    partition_max_running: int | None = None,
) -> tuple[Document, Document]:
    """The limits of ``name`` set anew; the slots of a removed limit's document stay (their
    runs go on)."""
    limits = {"rate": rate, "per_ms": per_ms, "max_running": max_running}
    limits["partition_max_running"] = partition_max_running
    return {"_id": name}, {"$set": limits, "$setOnInsert": {"starts": [], "slots": []}}


_HAS_LIMIT: Document = {
    "$or": [
        {"rate": {"$ne": None}},
        {"max_running": {"$ne": None}},
        {"partition_max_running": {"$ne": None}},
    ]
}


def bind_partition(
    name: str, token: str, partition: str, until: dt.datetime, now: dt.datetime
) -> tuple[Document, Pipeline]:
    """The slot of ``token`` (a claim that won a task of ``partition``) counts in that
    partition from now, and lives until ``until`` (its lease's end), if fewer than
    ``partition_max_running`` live slots of the partition are there (or the name has no such
    limit any more). Atomic on the name's document, as `acquire` is.

    Invariant: a slot counts in a partition only by this write, which admits it only below
    the partition's limit; so at most ``partition_max_running`` handlers of one partition
    run at once, whatever races between claims (a claim whose write is refused gives its
    task back: a race loses a claim, never breaks the limit). Slots taken before the limit
    counted partitions (`adopt`) count in the partition their runs give."""
    of_partition = {
        "$filter": {
            "input": {"$ifNull": ["$slots", []]},
            "as": "s",
            "cond": {
                "$and": [
                    {"$gt": ["$$s.until", now]},
                    {"$eq": ["$$s.partition", literal(partition)]},
                ]
            },
        }
    }
    allowed = {
        "$or": [
            {"$eq": [{"$ifNull": ["$partition_max_running", None]}, None]},
            {"$lt": [{"$size": of_partition}, "$partition_max_running"]},
        ]
    }
    bound = {"id": "$$s.id", "until": until, "partition": literal(partition)}
    slots = {
        "$map": {
            "input": {"$ifNull": ["$slots", []]},
            "as": "s",
            "in": {"$cond": [{"$eq": ["$$s.id", literal(token)]}, bound, "$$s"]},
        }
    }
    return {"_id": name, "$expr": allowed}, [{"$set": {"slots": slots}}]


def by_name(name: str) -> Document:
    return {"_id": name}


def limited(names: Sequence[str] | None) -> Document:
    """The documents (of ``names``) that limit their name: not a removed limit's."""
    if names is None:
        return dict(_HAS_LIMIT)
    return {"_id": {"$in": list(names)}, **_HAS_LIMIT}


def remove_limit(name: str, now: dt.datetime) -> tuple[Document, Pipeline]:
    """``name`` limited no more: its limits null, its window of starts emptied, its live slots
    kept for the runs that hold them (each frees its own, or expires: a dead holder's too),
    so that a limit set again counts them."""
    unlimited = {
        "rate": None,
        "per_ms": None,
        "max_running": None,
        "partition_max_running": None,
        "starts": literal([]),
    }
    return {"_id": name, **_HAS_LIMIT}, [{"$set": {**unlimited, "slots": _live("slots", now)}}]
