"""The config-task pattern: workers share one config task and commit against it.

Every worker reads the config, does its work with it, and commits its task on the condition
that the config is still the version it read. When an operator changes the config mid-run,
the commits of work done with the old config fail and write nothing; those tasks are done
again with the new one. So every result is computed with the config current at its commit.

    python examples/config_task.py
"""

from __future__ import annotations

import argparse
import contextlib
import logging

import anyio

import mscheduler as ms
from mscheduler.errors import PreconditionFailed

TASKS = 20


async def main(uri: str = "memory://") -> dict[str, object]:
    async with await ms.Scheduler.connect(uri, collection="config_example") as sched:
        await sched.publish("config", {"multiplier": 2}, name="config")
        for n in range(TASKS):
            await sched.publish(f"scale:{n}", {"n": n}, name="scale")
        redone = 0
        first_done = anyio.Event()  # one result committed with the first config
        in_flight = anyio.Event()  # since then, a worker read the config and is working

        async def scale(task: ms.Task) -> None:
            nonlocal redone
            while True:
                config = await sched.get("config")
                assert config is not None
                result = {"value": task.payload["n"] * config.payload["multiplier"]}
                if first_done.is_set():
                    in_flight.set()
                await anyio.sleep(0.1)  # the work, done with this config
                try:
                    await sched.commit(
                        complete=[(ms.current_lease(), result)],
                        require={"config": config.version},
                    )
                    first_done.set()
                    return
                except PreconditionFailed:
                    redone += 1  # the config changed under us: do it again with the new one

        async with contextlib.AsyncExitStack() as stack:
            for n in range(3):
                options = ms.WorkerOptions(worker_id=f"worker-{n}", max_running=2)
                await stack.enter_async_context(sched.consumer({"scale": scale}, options=options))
            await first_done.wait()
            await in_flight.wait()
            # An operator pushes a new config while work is under way.
            await sched.publish("config", {"multiplier": 10}, name="config", update_payload=True)
            tasks = await sched.wait_many([f"scale:{n}" for n in range(TASKS)], timeout=30)

        assert all(task.state is ms.TaskState.SUCCESS for task in tasks.values())
        used = [t.result["value"] // t.payload["n"] for t in tasks.values() if t.payload["n"]]
        assert set(used) == {2, 10}, f"each result uses the old or the new config: {used}"
        assert redone > 0, "the config change was supposed to catch some work in flight"
        summary = {"tasks": TASKS, "redone_after_config_change": redone}
        print(f"config task: {summary}")
        return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="memory://")
    logging.basicConfig(level=logging.WARNING)
    anyio.run(main, parser.parse_args().uri)
