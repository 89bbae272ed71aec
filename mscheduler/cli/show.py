"""``mscheduler show KEY``: one task as an operator reads it, not as the document stores it.

State and times first, the options that differ from the defaults, the attempts as a table,
then the result, and the error with the handler's own frames first (the frames inside
mscheduler that called it are counted, not printed: ``--json`` has them all)."""

from __future__ import annotations

import datetime as dt
import json
import pathlib
import re
from typing import Any

from ..models import Task, TaskOptions, TaskState, WorkerState, WorkerStateKind
from ..retry_policy import attempts_on_failures
from .output import extended, when

# A frame of `traceback.format_tb`: its "File" line and the source line under it, if any.
_FRAME = re.compile(r'  File "(?P<file>[^"]+)", line \d+, in [^\n]*\n(?:    [^\n]*\n)?')
_PACKAGE = str(pathlib.Path(__file__).resolve().parents[1])


def handler_frames_first(traceback: str) -> tuple[str, int]:
    """The frames outside mscheduler (the handler's), and how many inside it were left out."""
    frames = [m.group(0) for m in _FRAME.finditer(traceback)]
    if not frames:
        return traceback, 0
    own = [f for f in frames if _PACKAGE not in f]
    return "".join(own), len(frames) - len(own)


def _json(value: Any) -> str:
    return json.dumps(extended(value), indent=2, ensure_ascii=False)


def _options(options: TaskOptions) -> str:
    """Only what differs from the defaults: the rest is what every task has."""
    default = TaskOptions().model_dump()
    chosen = options.model_dump(mode="json")
    changed = {k: v for k, v in chosen.items() if v != default[k] and k != "not_before"}
    return ", ".join(f"{k}={v}" for k, v in changed.items()) or "(defaults)"


def _seconds(start: dt.datetime | None, end: dt.datetime | None) -> str:
    return "" if start is None or end is None else f"{(end - start).total_seconds():.3f}s"


def _took(ws: WorkerState) -> str:
    """How long the attempt ran; for one whose lease expired, how long its worker was heard
    from (its last ping): it ended, as ``ended`` says, when the lease then expired."""
    if ws.state is WorkerStateKind.TIMEOUT:
        return f"{_seconds(ws.started_at, ws.pinged_at or ws.started_at)}, then silent"
    return _seconds(ws.started_at, ws.finished_at)


def _attempts(task: Task) -> list[str]:
    """Every attempt kept, the earlier runs' first (oldest first), with the run each was part
    of when the key ran more than once; then how many older ones were dropped."""
    attempts: list[tuple[int, WorkerState]] = [(a.run, a) for a in task.earlier_attempts]
    attempts += [(task.runs, ws) for ws in task.worker_states]
    dropped = task.dropped_attempts + task.earlier_dropped
    lines: list[str] = []
    if attempts:
        lines.append("attempts:")
        runs = task.runs > 1
        header = ("run",) * runs + ("worker", "state", "started", "ended", "took", "error")
        table = [header]
        for run, ws in attempts:
            error = f"{ws.error.type}: {ws.error.message}" if ws.error else ""
            table.append(
                (str(run),) * runs
                + (
                    ws.worker_id,
                    ws.state.value,
                    when(ws.started_at),
                    when(ws.finished_at),
                    _took(ws),
                    " ".join(error.split()),
                )
            )
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        for row in table:
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
            lines.append("  " + "  ".join(cells).rstrip())
    if dropped:
        lines.append(f"  (and {dropped} older attempts, dropped from the history)")
    return lines


def render(task: Task, now: dt.datetime) -> str:
    lines: list[str] = []

    def field(label: str, value: str) -> None:
        if value:
            lines.append(f"{label + ':':<13}{value}")

    options = task.options
    tries = attempts_on_failures(options.max_unexpected_retries)
    field("key", task.key)
    field("name", task.name)
    field("state", f"{task.state.value} (attempt {task.attempts}; {tries} allowed on failures)")
    field("created", when(task.created_at, now))
    if options.partition is not None:  # its turn: its place in its name's claim order
        field("partition", f"{options.partition} (turn {when(task.turn, now)})")
    if task.runs > 1:  # retried or published anew over a finished run
        first = when(task.first_created_at, now)
        field("runs", f"{task.runs} (this is run {task.runs}; the first was created {first})")
    field("updated", when(task.updated_at, now))
    field("finished", when(task.finished_at, now))
    if not task.state.is_terminal:  # a retry time after the end says nothing true
        field("not before", when(task.not_before, now))
        if task.state is TaskState.PENDING:
            field("next claim", when(task.next_claim_at, now))
            field("retry at", when(task.retry_at, now))
    field("options", _options(options))
    field("depends on", ", ".join(task.depends_on))
    field("waiting on", ", ".join(task.deps_pending))
    if task.progress is not None:
        progress = task.progress
        field("progress", f"{progress.fraction:.0%} {progress.message}".rstrip())
    lines.append(f"{'payload:':<13}{_json(task.payload)}")
    lines += _attempts(task)
    if task.result is not None:
        lines.append(f"{'result:':<13}{_json(task.result)}")
    if task.error is not None:
        lines.append(f"{'error:':<13}{task.error.type}: {task.error.message}")
        frames, internal = handler_frames_first(task.error.traceback)
        if frames:
            lines.append(frames.rstrip("\n"))
        if internal:
            lines.append(f"  ({internal} frames inside mscheduler not shown: --json has them)")
    return "\n".join(lines)
