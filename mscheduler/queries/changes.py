"""Change-stream pipelines, pure: which writes a stream on the tasks (or on their database)
carries, and what of each event it sends. One builder, `changes_pipeline`, for every stream:
the process's discovery hub, a watch's own stream, and `SyncScheduler`'s wait.

Each part of the filter tests the event first (operation, changed fields, namespace), which
MongoDB checks on the oplog entry before any ``updateLookup``: a ping passes only when a
stream wants every write of its names.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .stages import Document, Pipeline

_WRITES = ["insert", "update", "replace"]
_WHOLE = ["insert", "replace"]

# What a consumer or a waiter needs of an event: not what was changed (``updateDescription``
# repeats the written values: with the document after the write, a large result is sent
# twice), nor what the handler alone reads. Kept out after the ``$match``, which may test them.
CONSUMER_NEEDLESS = (
    "updateDescription",
    "fullDocument.payload",
    "fullDocument.result",
    "fullDocument.worker_states.result",
)
WAITER_NEEDLESS = ("updateDescription",)


def without(fields: Sequence[str]) -> Document:
    """An exclusion ``$project`` stage; it never removes ``_id``, the resume token."""
    return {"$project": dict.fromkeys(fields, 0)}


def changes_pipeline(
    *,
    wakes: Iterable[str] = (),
    states: Iterable[str] = (),
    every: Iterable[str | None] = (),
    namespaces: tuple[str, str] | None = None,
) -> Pipeline:
    """The writes to tasks that someone listens for; deletes are left out (a deleted task's
    claim or ping simply matches nothing).

    - ``wakes``: names whose writes may give a consumer work: inserts, replaces and the
      updates that bumped ``wakes`` (`queries.derived.wakes_consumers`), so pings, claims and
      finishes wake nobody. A pipeline update's ``updatedFields`` names ``wakes`` on every
      engine, as it is a top-level number (a changed subdocument may be reported by paths
      inside it instead);
    - ``states``: keys whose state changes a waiter waits for: inserts, replaces and the
      updates that changed ``state`` (without this, every ping costs a waiter one lookup);
    - ``every``: names of which every write is wanted (a watch); ``None`` among them: every
      write of every task;
    - ``namespaces`` (the tasks collection, the control version's): a stream on the database,
      whose events of other collections the ``$match`` drops, and that carries the control
      version's whoever listens: those writes are rare, and a listener joining later then
      reopens nothing.

    A task's result (what only a waiter or a watch reads) is sent only when one listens."""
    wakes, states, every = sorted(set(wakes)), sorted(set(states)), set(every)
    clauses: list[Document] = []
    if wakes:
        clauses.append(_changed("wakes", {"fullDocument.name": {"$in": wakes}}))
    if states:
        clauses.append(_changed("state", {"fullDocument.key": {"$in": states}}))
    if None in every:
        clauses.append({"operationType": {"$in": _WRITES}})
    elif every:
        named = sorted(name for name in every if name is not None)
        clauses.append({"operationType": {"$in": _WRITES}, "fullDocument.name": {"$in": named}})
    if not clauses:
        match: Document = {"operationType": "none"}  # nobody listens (yet)
    elif len(clauses) == 1:
        match = clauses[0]
    else:
        match = {"$or": clauses}
    if namespaces is not None:
        tasks, controls = namespaces
        match = {"$or": [{"ns.coll": tasks, **match}, {"ns.coll": controls}]}
    needless = CONSUMER_NEEDLESS if not states and not every else WAITER_NEEDLESS
    return [{"$match": match}, without(needless)]


def _changed(field: str, where: Document) -> Document:
    updated = {
        "operationType": "update",
        f"updateDescription.updatedFields.{field}": {"$exists": True},
    }
    return {"$or": [{"operationType": {"$in": _WHOLE}}, updated], **where}
