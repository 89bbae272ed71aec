"""The signal (``<collection>.signal``, `store.signal`): its one document's filter, its bump,
a poller's registration, and its read, pure.

The document: ``tasks`` (a count of writes that may give a consumer work), ``controls`` (a
count of control changes) and ``polled_until`` (until when some process polls: writers bump
only while that lies ahead)."""

from __future__ import annotations

import datetime as dt

from .stages import Document

SIGNAL: Document = {"_id": "tasks"}
# Only what a reader compares: the counts and the registration, never anything more.
SIGNAL_FIELDS: Document = {"_id": 0, "tasks": 1, "controls": 1, "polled_until": 1}


def bump(*, controls: bool) -> tuple[Document, Document]:
    """One more write that may give work (an upsert: the first bump makes the document); a
    control change counts in both, as it may give work too (a name resumed)."""
    counts = {"tasks": 1, "controls": 1} if controls else {"tasks": 1}
    return SIGNAL, {"$inc": counts}


def register(until: dt.datetime) -> tuple[Document, Document]:
    """A poller's registration: writers bump until ``until``. Several pollers set about the
    same time; the last one's stands, and each renews it long before it lapses."""
    return SIGNAL, {"$set": {"polled_until": until}}
