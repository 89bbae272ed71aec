"""Operating a queue: progress from a long handler (one at a time, by a limit), a debounced
reindex, a name paused while its provider is down, and a one-time code that expires.

python examples/operations.py                      # in-process, nothing to set up
python examples/operations.py --uri "mongodb://localhost:27017/?directConnection=true"
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
from typing import Any

import anyio

import mscheduler as ms


async def main(uri: str) -> dict[str, Any]:
    async with await ms.Scheduler.connect(uri, collection="operations") as sched:
        seen_progress: list[float] = []
        reindexed: list[Any] = []

        async def export(task: ms.Task) -> str:
            lease = ms.current_lease()
            for done in range(1, 5):
                await lease.progress(done / 4, f"exported {done}/4 parts")  # within a second
                await anyio.sleep(0.05)
                current = await sched.get(task.key)
                if current is not None and current.progress is not None:
                    seen_progress.append(current.progress.fraction)
            return "exported"

        async def reindex(task: ms.Task) -> None:
            reindexed.append(task.payload)

        async def sms(task: ms.Task) -> None:
            return None

        # Three edits in a row: one reindex, with the last edit's payload.
        for version in (1, 2, 3):
            await sched.publish("reindex:doc-7", {"version": version}, name="reindex", debounce=0.3)
        # The SMS provider is down: pause the name. A one-time code is worthless after a
        # moment, so it expires if not sent by then; the other text waits for the resume.
        await sched.pause("sms", reason="provider outage")
        soon = sched.clock.now() + dt.timedelta(milliseconds=200)
        otp = ms.TaskOptions(expires_at=soon)
        await sched.publish("sms:otp", {"to": "+100", "code": 4242}, name="sms", options=otp)
        await sched.publish("sms:1", {"to": "+100"}, name="sms")

        # However many workers: one export at a time (the others wait for its slot).
        await sched.set_limit("export", max_running=1)
        quick = ms.TaskOptions(ping_interval_ms=20, worker_timeout_ms=1_000)
        await sched.publish("export:1", None, name="export", options=quick)
        handlers = {"export": export, "reindex": reindex, "sms": sms}
        options = ms.WorkerOptions(worker_id="ops", schedule_refresh_ms=100)
        async with sched.consumers(handlers, count=2, options=options):
            done = await sched.wait_many(["export:1", "reindex:doc-7", "sms:otp"], timeout=30)
            held = await sched.get("sms:1")
            await sched.resume("sms")
            await sched.wait("sms:1", timeout=30)
        summary = {
            "progress_seen": seen_progress,
            "reindexed": reindexed,
            "otp": done["sms:otp"].state.value,
            "sms_while_paused": held.state.value if held else None,
        }
        print(summary)
        return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="memory://")
    logging.basicConfig(level=logging.WARNING)
    anyio.run(main, parser.parse_args().uri)
