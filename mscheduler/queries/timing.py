"""When a waiting task may start, changed after publish: expiry (``options.expires_at``: not
started by then, cancelled) and debounce (a repeated publish pushes the start back)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from ..models import TaskState
from .derived import recompute
from .stages import Document, Pipeline, literal
from .tasks import expired_by

NOT_STARTED = [TaskState.PENDING.value, TaskState.BLOCKED.value]


def expired(names: Sequence[str], now: dt.datetime) -> Document:
    """Tasks of ``names`` past their expiry and still waiting (served by ``expiry``: bounded
    on all three fields; ``$type: date`` implies its partial filter)."""
    return {"name": {"$in": list(names)}, "state": {"$in": NOT_STARTED}, **expired_by(now)}


def expire_filter(key: str, now: dt.datetime) -> Document:
    """The cancel of one expired task, conditional: a task claimed in between (by a worker
    whose clock is behind) is left alone."""
    return {"key": key, "state": {"$in": NOT_STARTED}, **expired_by(now)}


def debounce_filter(key: str, name: str) -> Document:
    """A task of this name that has not started: the only kind a debounce may change. Not
    started is no attempt at all, not only waiting: a failed attempt waiting for its retry
    is pending too, and keeps the payload its retry runs with (and its retry time)."""
    return {
        "key": key,
        "name": name,
        "state": {"$in": NOT_STARTED},
        "worker_states": {"$size": 0},
    }


def debounce_update(payload: Any, not_before: dt.datetime, now: dt.datetime) -> Pipeline:
    """The newest payload, and the start pushed back to ``not_before``: publishes of a key
    within the window make one run, with the last payload (BullMQ's and Agenda's debounce).
    A later start wakes no consumer: one that expected the old time finds it not claimable
    and reads the new one."""
    return [{"$set": {"payload": literal(payload), "not_before": not_before}}, *recompute(now)]
