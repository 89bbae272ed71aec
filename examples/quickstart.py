"""Publish a few tasks and let three consumers run them, on the embedded backend by default.

python examples/quickstart.py                      # in-process, nothing to set up
python examples/quickstart.py --uri "mongodb://localhost:27017/?directConnection=true"
"""

from __future__ import annotations

import argparse
import logging

import anyio

import mscheduler as ms


async def send_email(task: ms.Task) -> dict[str, str]:
    """A handler: its return value is stored as the task's result; an exception is a failure."""
    if task.payload["to"].startswith("bounce"):
        raise ValueError(f"mailbox of {task.payload['to']} is full")
    await anyio.sleep(0.01)  # the work
    return {"sent_to": task.payload["to"]}


async def main(uri: str) -> None:
    async with await ms.Scheduler.connect(uri, collection="quickstart") as sched:
        options = ms.TaskOptions(max_unexpected_retries=1, unexpected_retry_delay_ms=0)
        recipients = ["ada", "grace", "bounce", "linus", "barbara"]
        keys = [f"email:{name}" for name in recipients]
        for key, name in zip(keys, recipients, strict=True):
            result = await sched.publish(key, {"to": name}, name="email", options=options)
            print(f"published {key:<15} created={result.created}")
        again = await sched.publish("email:ada", {"to": "someone-else"}, name="email")
        print(f"published {'email:ada':<15} created={again.created}  (same key: no new task)")
        urgent = ms.TaskOptions(priority=10)
        await sched.publish("email:urgent", {"to": "ops"}, name="email", options=urgent)
        keys.append("email:urgent")

        worker = ms.WorkerOptions(worker_id="worker", max_running=2)  # worker-1 .. worker-3
        async with sched.consumers({"email": send_email}, count=3, options=worker):
            finished = await sched.wait_many(keys, timeout=30)  # from the change stream

        for key, task in finished.items():
            runs = ", ".join(f"{ws.worker_id}:{ws.state.value}" for ws in task.worker_states)
            outcome = task.result if task.state is ms.TaskState.SUCCESS else task.error.message  # type: ignore[union-attr]
            print(f"final     {key:<15} {task.state.value:<8} [{runs}] {outcome}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="memory://")
    logging.basicConfig(level=logging.WARNING)
    anyio.run(main, parser.parse_args().uri)
