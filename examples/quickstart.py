"""Publish a few tasks and work through them, on the embedded backend by default.

python examples/quickstart.py                      # in-process, nothing to set up
python examples/quickstart.py --uri "mongodb://localhost:27017/?directConnection=true"
"""

from __future__ import annotations

import argparse
import logging

import anyio

import mscheduler as ms


async def main(uri: str) -> None:
    async with await ms.Scheduler.connect(uri, collection="quickstart") as sched:
        options = ms.TaskOptions(max_unexpected_retries=1, unexpected_retry_delay_ms=0)
        for n in range(5):
            to = {"to": f"user{n}@example.com"}
            result = await sched.publish(f"email:{n}", to, name="email", options=options)
            print(f"published {result.task.key:<10} created={result.created}")
        again = await sched.publish("email:0", {"to": "someone-else@example.com"}, name="email")
        print(f"published {again.task.key:<10} created={again.created}  (same key: no new task)")

        # A worker's loop, written against the store: claim, do the work, record the outcome.
        while (lease := await sched.store.claim("worker-1", names=["email"])) is not None:
            task = lease.task
            if task.key == "email:3":
                done = await sched.store.fail(lease, ValueError("mailbox full"))
            else:
                done = await sched.store.succeed(lease, {"sent_to": task.payload["to"]})
            print(f"ran       {task.key:<10} -> {done.state.value}")

        for n in range(5):
            task = await sched.get(f"email:{n}")
            assert task is not None
            outcome = task.result if task.error is None else f"error: {task.error.message}"
            print(f"final     {task.key:<10} {task.state.value:<8} {outcome}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="memory://")
    logging.basicConfig(level=logging.WARNING)
    anyio.run(main, parser.parse_args().uri)
