"""Partitions' turns (``<collection>.partitions``, one document per name and partition): the
reads and updates, pure.

Fairness between partitions is decided at publish, by start-time fair queuing, so a claim
reads what it reads today (the claim index, in claim order) and costs nothing more. A
partitioned task's place in its name's claim order is its *turn*, a time stored in the
document's ``created_at`` (the claim index's field; its publish time is then kept in
``published_at``, which only partitioned tasks carry). A task without a partition keeps its
publish time there, as always: it pays nothing, and takes its place by publish time among
the partitions' turns.

A partition's document ``{_id: '["<name>", "<partition>"]', name, partition, next_turn,
seen_at}`` holds the turn its next task
takes. A publish of ``count`` tasks of one partition takes ``count`` turns in one atomic
update: from ``max(next_turn, head)``, one `QUANTUM_MS` apart, and moves ``next_turn``
past them. ``head`` is the place of the first task a claim of that name and priority would
take now (`head_of`), or the publish time if that is earlier or there is none.

Invariant: among claimable tasks of one name and priority, the tasks of a partition are
placed one `QUANTUM_MS` apart from where the partition's backlog ends, or from the head of
the claim order when it has none: a partition that publishes a burst of N tasks takes N
turns from the head, and a partition that publishes after it takes turns from the head too,
interleaved with that burst's, not behind it. So the partition whose last start is oldest
(whose next turn is earliest) goes first. Priority comes before turns (the claim index sorts
by priority first), and the head is read at the task's own priority.

What it does not promise: a turn is decided at publish, not at claim; the turns of a
partition whose backlog drained long ago restart at the head; a partition's document
forgotten (the TTL, `layout.PARTITIONS_TTL`, a day after its last turn) restarts at the
head too. Concurrent publishes of one partition take distinct turns (the update is atomic
on its document); a publish whose insert then fails leaves its turns unused, which no one
waits for.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from ..models import TaskState
from .stages import Document, Pipeline, literal

# How far apart the turns of one partition are: BSON's precision, so a burst of a partition
# spreads over its size in milliseconds, and the turns of several partitions interleave.
QUANTUM_MS = 1

# The head's read: the first task of a name and priority a claim would take now, by the claim
# index (`layout`: claim_order_v2, equality on name, state and priority, in its order).
HEAD_SORT: list[tuple[str, int]] = [("created_at", 1), ("_id", 1)]
HEAD_PROJECTION: Document = {"_id": 0, "created_at": 1}


def head_of(name: str, priority: int, now: dt.datetime) -> Document:
    """The pending tasks of ``name`` at ``priority`` claimable now; the first in `HEAD_SORT`
    is the head of the claim order (``next_claim_at`` is the index's last field: the scan
    skips tasks not due by their index entries, without reading them)."""
    return {
        "name": name,
        "state": TaskState.PENDING.value,
        "options.priority": priority,
        "next_claim_at": {"$lte": now},
    }


def partition_id(name: str, partition: str) -> str:
    """A partition's document's ``_id``: its name and partition as a JSON array, one string
    for any two (a subdocument ``_id`` is not hashable in the memory engine's index)."""
    return json.dumps([name, partition], ensure_ascii=False)


def take_turns(
    name: str, partition: str, head: dt.datetime, count: int, now: dt.datetime
) -> tuple[Document, Pipeline]:
    """``count`` turns of the partition, the first at ``max(next_turn, head)``: the update
    moves ``next_turn`` past them, and the document after it says where they end (`first_of`).
    An upsert: a partition seen for the first time starts at ``head``. ``seen_at`` is when it
    last took turns, which its TTL counts from."""
    start = {"$max": [{"$ifNull": ["$next_turn", head]}, head]}
    moved = {"$add": [start, count * QUANTUM_MS]}
    fields = {
        "name": literal(name),  # a caller's strings enter a pipeline as literals
        "partition": literal(partition),
        "next_turn": moved,
        "seen_at": now,
    }
    return {"_id": partition_id(name, partition)}, [{"$set": fields}]


def untake_turn(name: str, partition: str, turn: dt.datetime) -> tuple[Document, Pipeline]:
    """Give back ``turn``, the last turn taken of the partition, unused (a publish of a key
    that exists: `store.partitions.Partitions.untake`): ``next_turn`` moves back to it, only
    if no turn was taken after it (the filter: ``next_turn`` is still the one that turn left,
    within its millisecond).

    Invariant: a turn is spent only by a task that takes it; a publish that creates or
    replaces nothing leaves the partition where it was, unless another publish took turns
    after its own (then its turn stays a gap, as a failed insert's)."""
    after = turn + dt.timedelta(milliseconds=QUANTUM_MS)
    taken_last = {"$gte": after, "$lt": after + dt.timedelta(milliseconds=QUANTUM_MS)}
    back = {"$add": ["$next_turn", -QUANTUM_MS]}
    return {"_id": partition_id(name, partition), "next_turn": taken_last}, [
        {"$set": {"next_turn": back}}
    ]


def first_of(after: dict[str, Any], count: int) -> Any:
    """The first of the ``count`` turns an update of `take_turns` took, from the document
    after it (a time as the driver read it)."""
    return after["next_turn"] - dt.timedelta(milliseconds=count * QUANTUM_MS)


def placed(document: Document, turn: dt.datetime) -> Document:
    """A new task's document at ``turn`` in its name's claim order: its publish time kept as
    ``published_at``, ``created_at`` its turn (what the claim index sorts on). Placed again
    (a batch's transaction run again), it keeps its publish time and takes the new turn."""
    document.setdefault("published_at", document["created_at"])
    document["created_at"] = turn
    return document
