"""`mscheduler demo`, the main job: a realistic mix of tasks run by three consumers, live.

It needs nothing set up (the embedded backend); with ``--uri`` it runs against a server.
Keys carry a run id, so running it again against the same collection publishes new tasks.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import random
import secrets
from typing import Any

import anyio
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..api import Scheduler
from ..handlers import Consumer
from ..models import StatsRow, Task, TaskOptions
from ..specs import TaskSpec, chord
from ..worker_options import WorkerOptions
from .observe import stats_table


async def _publish_mix(sched: Scheduler, run: str, emails: int) -> list[str]:
    urgent, normal = TaskOptions(priority=5), TaskOptions()
    mails = [
        TaskSpec(
            key=f"{run}:email:{n}",
            name="email",
            payload={"to": f"user{n}@example.com"},
            options=urgent if n % 4 == 0 else normal,
        )
        for n in range(emails)
    ]
    await sched.publish_many(mails)  # one bulk write, however many
    keys = [mail.key for mail in mails]
    soon = sched.clock.now() + dt.timedelta(seconds=1.5)
    await sched.publish(
        f"{run}:reminder",
        {"at": soon.isoformat()},
        name="reminder",
        options=TaskOptions(not_before=soon),
    )
    flaky = TaskOptions(max_unexpected_retries=3, unexpected_retry_delay_ms=300)
    await sched.publish(f"{run}:report", {"fails": 2}, name="report", options=flaky)
    parts = [
        TaskSpec(key=f"{run}:resize:{n}", name="resize", payload={"image": n}) for n in range(6)
    ]
    join = TaskSpec(key=f"{run}:thumbnails", name="index", payload={"images": 6})
    await sched.publish_many(chord(parts, join))
    keys += [f"{run}:reminder", f"{run}:report", *(p.key for p in parts), join.key]
    return keys


async def _work(seconds: float) -> None:
    await anyio.sleep(seconds * random.uniform(0.5, 1.5))


async def send_email(task: Task) -> dict[str, Any]:
    await _work(0.05)
    return {"sent_to": task.payload["to"]}


async def remind(task: Task) -> str:
    return "reminded"


async def report(task: Task) -> str:
    await _work(0.05)
    attempt = task.attempts
    if attempt <= task.payload["fails"]:
        raise RuntimeError(f"the warehouse timed out (attempt {attempt})")
    return f"report built on attempt {attempt}"


async def resize(task: Task) -> str:
    await _work(0.08)
    return f"image {task.payload['image']} resized"


async def index(task: Task) -> int:
    return int(task.payload["images"])


HANDLERS = {
    "email": send_email,
    "reminder": remind,
    "report": report,
    "resize": resize,
    "index": index,
}


async def run_demo(sched: Scheduler, console: Console, *, emails: int = 24) -> list[StatsRow]:
    run = f"demo-{secrets.token_hex(3)}"
    keys = await _publish_mix(sched, run, emails)
    console.print(
        f"published {len(keys)} tasks ({run}): emails with priorities, a delayed reminder, "
        "a report that fails twice before it succeeds, and a chord of 6 resizes joined by an index"
    )
    consumers: list[Consumer] = []
    async with contextlib.AsyncExitStack() as stack:
        for n in range(3):
            options = WorkerOptions(worker_id=f"{run}-worker-{n}", max_running=4)
            consumers.append(
                await stack.enter_async_context(sched.consumer(HANDLERS, options=options))
            )
        columns = (
            TextColumn("[bold]tasks"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console, transient=False) as progress:
            bar = progress.add_task("tasks", total=len(keys))
            async with anyio.create_task_group() as group:

                async def show_progress() -> None:
                    # The consumers' own counters: reading every task ten times a second
                    # once made the demo slower than its tasks.
                    while True:
                        done = sum(consumer.stats.succeeded for consumer in consumers)
                        progress.update(bar, completed=min(done, len(keys)))
                        await anyio.sleep(0.1)

                group.start_soon(show_progress)
                await sched.wait_many(keys)  # every task ended (a stream, or polling)
                progress.update(bar, completed=len(keys))
                group.cancel_scope.cancel()
    rows = [row for row in await sched.stats() if row.name in HANDLERS]
    console.print(stats_table(rows))
    return rows
