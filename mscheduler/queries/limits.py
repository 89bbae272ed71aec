"""Limits per task name (``<collection>.limits``, one document per name): the updates, pure.

A document ``{_id: name, rate, per_ms, max_running, starts: [{id, until}], slots: [{id,
until}]}``: a start counts until ``per_ms`` after it (``until``), a slot until its lease ends.
A claim of that name first takes a token here, in one conditional update that is atomic on
this document: it succeeds only while fewer than ``rate`` starts lie within the last
``per_ms`` (a sliding window, exact) and fewer than ``max_running`` slots are live. Expired
entries are pruned by the same write, so both arrays stay bounded by the limits themselves.

Invariant: a handler of a limited name starts only under a start counted here (a claim's
token, or `start` for a local retry), so in any window of ``per_ms`` at most ``rate``
handlers start, and at most ``max_running`` run at once (a slot lives while its run does:
the holder extends it, a crashed holder's expires with its lease). A token whose claim found
nothing is given back; a worker that dies in between leaves it unused: the limit errs on the
safe side.

A slot leaves the document only with its run (released, given back) or by expiring (pruned by
a later write): removing a limit keeps the document, its limits null (`remove_limit`), so a
limit set again finds the slots its running tasks hold, whatever the order in which consumers
learn of the two changes. Only a document with a limit is one (`limited`).

Clocks: ``now`` is the acquiring worker's clock (`$$NOW` is missing on the memory engine), so
a worker whose clock runs δ ahead of another's ends that one's starts δ early. With the
workers' clocks within δ of each other, at most ``rate`` start in any ``per_ms - δ``; the
bound on δ is the one leases already assume (`consumer.executor.expiry_margin`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

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


def acquire(
    name: str, token: str, now: dt.datetime, until: dt.datetime
) -> tuple[Document, Pipeline]:
    """Take a start and a slot for ``name``, if its limits allow one now; the slot lives
    until ``until`` (the lease's expiry) unless extended."""
    allowed = {"$and": [_within("rate", "starts", now), _within("max_running", "slots", now)]}
    start = {"id": literal(token), "until": {"$add": [now, {"$ifNull": ["$per_ms", 0]}]}}
    update = {
        "$set": {
            "starts": {"$concatArrays": [_live("starts", now), [start]]},
            "slots": {
                "$concatArrays": [_live("slots", now), [{"id": literal(token), "until": until}]]
            },
        }
    }
    return {"_id": name, "$expr": allowed}, [update]


def start(name: str, token: str, now: dt.datetime) -> tuple[Document, Pipeline]:
    """Count one more start for ``name`` (a local retry of a handler whose slot is held), if
    its rate allows one now; a name without a rate takes it always."""
    entry = {"id": literal(token), "until": {"$add": [now, {"$ifNull": ["$per_ms", 0]}]}}
    update = {"$set": {"starts": {"$concatArrays": [_live("starts", now), [entry]]}}}
    return {"_id": name, "$expr": _within("rate", "starts", now)}, [update]


def give_back(name: str, token: str) -> tuple[Document, Document]:
    """A token whose claim found nothing: neither a start nor a slot was used."""
    return {"_id": name}, {"$pull": {"starts": {"id": token}, "slots": {"id": token}}}


def adopt(name: str, tokens: Sequence[str], until: dt.datetime) -> tuple[Document, Pipeline]:
    """Runs that started before their name was limited take slots, whatever the limit: they
    run already, and claims count them from now on."""
    slots = [{"id": literal(token), "until": until} for token in tokens]
    added = {"$concatArrays": [{"$ifNull": ["$slots", []]}, slots]}
    return {"_id": name}, [{"$set": {"slots": added}}]


def release(name: str, token: str) -> tuple[Document, Document]:
    """The task ended: its slot frees; its start still counts in the window."""
    return {"_id": name}, {"$pull": {"slots": {"id": token}}}


def extend(name: str, tokens: Sequence[str], until: dt.datetime) -> tuple[Document, Pipeline]:
    """The holders still run: their slots live until ``until`` (their lease's expiry)."""
    slots = {
        "$map": {
            "input": {"$ifNull": ["$slots", []]},
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
    return {"_id": name}, [{"$set": {"slots": slots}}]


def set_limit(
    name: str, rate: int | None, per_ms: int | None, max_running: int | None
) -> tuple[Document, Document]:
    """The limits of ``name`` set anew; the slots of a removed limit's document stay (their
    runs go on)."""
    return {"_id": name}, {
        "$set": {"rate": rate, "per_ms": per_ms, "max_running": max_running},
        "$setOnInsert": {"starts": [], "slots": []},
    }


_HAS_LIMIT: Document = {"$or": [{"rate": {"$ne": None}}, {"max_running": {"$ne": None}}]}


def limited(names: Sequence[str] | None) -> Document:
    """The documents (of ``names``) that limit their name: not a removed limit's."""
    if names is None:
        return dict(_HAS_LIMIT)
    return {"_id": {"$in": list(names)}, **_HAS_LIMIT}


def remove_limit(name: str, now: dt.datetime) -> tuple[Document, Pipeline]:
    """``name`` limited no more: its limits null, its window of starts emptied, its live slots
    kept for the runs that hold them (each frees its own, or expires: a dead holder's too),
    so that a limit set again counts them."""
    unlimited = {"rate": None, "per_ms": None, "max_running": None, "starts": literal([])}
    return {"_id": name, **_HAS_LIMIT}, [{"$set": {**unlimited, "slots": _live("slots", now)}}]
