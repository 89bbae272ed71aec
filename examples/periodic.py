"""Periodic tasks: a report every night at 03:00 Paris time and a heartbeat every 10 s, run by
three consumers that each publish the due occurrences, once each.

python examples/periodic.py                      # in-process, nothing to set up
python examples/periodic.py --uri "mongodb://localhost:27017/?directConnection=true"
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
from typing import Any

import anyio

import mscheduler as ms
from mscheduler.testing import Clock, ManualClock


async def main(uri: str, clock: Clock | None = None) -> dict[str, Any]:
    async with await ms.Scheduler.connect(uri, collection="periodic", clock=clock) as sched:
        await sched.schedule(
            "nightly-report",
            name="report",
            cron="0 3 * * *",
            timezone="Europe/Paris",  # 03:00 local, summer and winter alike
            payload={"kind": "sales"},
            skip_if_running=True,  # never two reports at once
        )
        await sched.schedule(
            "heartbeat", name="heartbeat", every=dt.timedelta(seconds=10), catch_up="none"
        )
        for schedule in await sched.schedules():
            print(f"schedule {schedule.id:<15} next at {schedule.next_at.isoformat()}")

        beats: list[str] = []
        three = anyio.Event()

        async def heartbeat(task: ms.Task) -> None:
            beats.append(task.key)
            if len(beats) == 3:
                three.set()

        async def report(task: ms.Task) -> dict[str, str]:
            return {"report": task.payload["kind"]}

        handlers = {"heartbeat": heartbeat, "report": report}
        options = ms.WorkerOptions(worker_id="periodic", poll_interval_ms=100)
        async with sched.consumers(handlers, count=3, options=options):
            with anyio.fail_after(60):
                if isinstance(clock, ManualClock):  # a test's clock: moved, not waited for
                    while not three.is_set():
                        clock.advance(1)
                        await anyio.sleep(0.02)
                await three.wait()
        print(f"heartbeats: {len(beats)} ({', '.join(beats)})")
        await sched.unschedule("heartbeat")
        return {"heartbeats": beats, "schedules": [s.id for s in await sched.schedules()]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="memory://")
    logging.basicConfig(level=logging.WARNING)
    anyio.run(main, parser.parse_args().uri)
