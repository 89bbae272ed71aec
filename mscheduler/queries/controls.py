"""The control version (``<collection>.controls``, `store.controls`): its one document's
filter, its bump and its read, pure."""

from __future__ import annotations

import datetime as dt

from .stages import Document, Pipeline

VERSION: Document = {"_id": "version"}
VERSION_ONLY: Document = {"version": 1}
# A stream of its own on the version's collection (one document): every change of it.
VERSION_CHANGES: Pipeline = []


def bump(now: dt.datetime) -> tuple[Document, Document]:
    """One more change (an upsert: the first control write makes the document)."""
    return VERSION, {"$inc": {"version": 1}, "$set": {"changed_at": now}}
