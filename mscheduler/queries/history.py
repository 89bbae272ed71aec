"""A key's history across its runs: what a replaced run leaves to the next one.

A retry, a ``replace_finished`` publish and `Scheduler.replace` start a new run of a key: a
new document whose ``worker_states`` are empty, as the claim's rules (slots, retries,
``max_tries``) count only the current run. What the earlier runs did is not lost with them:
`carried_history` gives the fields the new document takes over. Invariants:

- ``earlier_attempts`` holds the attempts of the earlier runs in the order they were claimed
  (oldest first), each with the ``run`` it was part of, as it ended (a state still running,
  which only a commit's replace may meet, is recorded as released at the replace), without
  its result: at most `constants.KEPT_EARLIER_ATTEMPTS` of them (their size is in the
  growth reserve, `encoding.growth_reserve`);
- ``earlier_dropped`` counts every earlier attempt not kept (those the run had dropped
  already, ``dropped_attempts``, and those that fell out of the bound): kept plus dropped is
  every attempt the key's earlier runs made;
- ``runs`` is the run's number (1 for the first publish) and ``first_created_at`` when the
  key was first published.

Only the replace writes these fields; every other write leaves them as they are.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from .. import constants as c
from ..models import Task, WorkerStateKind

Document = dict[str, Any]


def ended_attempt(task: Task, index: int, now: dt.datetime) -> Document:
    """Attempt ``index`` of ``task``'s current run, as the next run keeps it."""
    ws = task.worker_states[index]
    attempt = ws.model_dump(exclude={"result"})
    if ws.state is WorkerStateKind.RUNNING:
        attempt.update(state=WorkerStateKind.RELEASED.value, ping_expire_at=None, finished_at=now)
    else:
        attempt["state"] = ws.state.value
    attempt["result"] = None
    attempt["run"] = task.runs
    return attempt


def carried_history(task: Task, now: dt.datetime) -> Document:
    """The history fields of the run that replaces ``task`` (read at the version the replace
    matches, so nothing is lost in between)."""
    earlier = [
        {**attempt.model_dump(exclude={"result"}), "state": attempt.state.value, "result": None}
        for attempt in task.earlier_attempts
    ]
    earlier += [ended_attempt(task, index, now) for index in range(len(task.worker_states))]
    kept = earlier[-c.KEPT_EARLIER_ATTEMPTS :]
    return {
        "runs": task.runs + 1,
        "first_created_at": task.first_created_at or task.created_at,
        "earlier_attempts": kept,
        "earlier_dropped": task.earlier_dropped + task.dropped_attempts + len(earlier) - len(kept),
    }
