"""A web app's view: request handlers publish tasks and answer at once; workers do the work.

Requests arrive concurrently, some twice (a double-clicked "sign up", a retried POST). The
task key makes publishing idempotent, so every user gets exactly one welcome email however
often the request comes, and a status endpoint answers from the task document.

    python examples/webapp.py
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import random
from typing import Any

import anyio

import mscheduler as ms

USERS = 40


class App:
    """The request handlers of a web app (any framework would call these)."""

    def __init__(self, sched: ms.Scheduler) -> None:
        self.sched = sched

    async def post_signup(self, user: str) -> tuple[int, dict[str, Any]]:
        result = await self.sched.publish(
            f"welcome-email:{user}",
            {"user": user},
            name="welcome-email",
            options=ms.TaskOptions(max_unexpected_retries=5, unexpected_retry_delay_ms=10),
        )
        return 202, {"task": result.task.key, "new": result.created}

    async def get_status(self, user: str) -> tuple[int, dict[str, Any]]:
        task = await self.sched.get(f"welcome-email:{user}")
        if task is None:
            return 404, {}
        return 200, {"state": task.state.value, "result": task.result}


async def main(uri: str = "memory://") -> dict[str, Any]:
    sent: list[str] = []

    async def send_welcome(task: ms.Task) -> str:
        await anyio.sleep(random.uniform(0.001, 0.005))
        if random.random() < 0.1:
            raise ConnectionError("the mail server hiccuped")  # retried by the queue
        sent.append(task.payload["user"])
        return f"sent to {task.payload['user']}"

    async with await ms.Scheduler.connect(uri, collection="webapp") as sched:
        app = App(sched)
        async with contextlib.AsyncExitStack() as stack:
            for n in range(2):
                options = ms.WorkerOptions(worker_id=f"mailer-{n}", max_running=8)
                consumer = sched.consumer({"welcome-email": send_welcome}, options=options)
                await stack.enter_async_context(consumer)
            requests = [f"user{n}" for n in range(USERS)] * 2  # every signup posted twice
            random.shuffle(requests)
            answers: list[dict[str, Any]] = []

            async def request(user: str) -> None:
                status, body = await app.post_signup(user)
                assert status == 202
                answers.append(body)

            async with anyio.create_task_group() as tg:
                for user in requests:
                    tg.start_soon(request, user)
            keys = [f"welcome-email:user{n}" for n in range(USERS)]
            await sched.wait_many(keys, timeout=30)
            status, body = await app.get_status("user7")

    assert sum(answer["new"] for answer in answers) == USERS, "a double submit made two tasks"
    assert sorted(sent) == sorted(f"user{n}" for n in range(USERS)), "an email went twice or never"
    assert status == 200 and body["state"] == "success"
    summary = {"requests": len(requests), "emails_sent": len(sent)}
    print(f"web app: {summary}")
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="memory://")
    logging.basicConfig(level=logging.ERROR)
    anyio.run(main, parser.parse_args().uri)
