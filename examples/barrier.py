"""The barrier pattern: many range tasks fold their outputs into one barrier task.

Each range worker commits, in one transaction: its own task done, the barrier task replaced by
one that also lists its output, and (when it was the last range) the join task published, all
on the condition that the barrier is still the version it read. Two workers that race on the
barrier cannot both win: the loser's commit writes nothing, and it reads the barrier again.

    python examples/barrier.py
"""

from __future__ import annotations

import argparse
import contextlib
import logging

import anyio

import mscheduler as ms
from mscheduler.errors import PreconditionFailed

RANGES = 12


def barrier_spec(done: list[str]) -> ms.TaskSpec:
    # The barrier holds state only: no consumer handles the name "barrier".
    return ms.TaskSpec(key="barrier", name="barrier", payload={"done": sorted(done)})


async def main(uri: str = "memory://") -> dict[str, object]:
    async with await ms.Scheduler.connect(uri, collection="barrier_example") as sched:
        await sched.publish("barrier", {"done": []}, name="barrier")
        for n in range(RANGES):
            await sched.publish(f"range:{n}", {"range": n}, name="range")
        conflicts = 0

        async def process_range(task: ms.Task) -> None:
            nonlocal conflicts
            output = f"s3://bucket/out/part-{task.payload['range']:03d}"
            await anyio.sleep(0.001)  # the work
            while True:
                barrier = await sched.get("barrier")
                assert barrier is not None
                done = [*barrier.payload["done"], output]
                await anyio.sleep(0.001)  # building the new state: others may commit meanwhile
                follow_up = [barrier_spec(done)]
                if len(done) == RANGES:
                    follow_up.append(ms.TaskSpec(key="join", name="join", payload={"parts": done}))
                try:
                    await sched.commit(
                        complete=[(ms.current_lease(), output)],
                        delete=["barrier"],
                        publish=follow_up,
                        require={"barrier": barrier.version},
                    )
                    return
                except PreconditionFailed:
                    conflicts += 1  # another range committed first: read it again

        async def join(task: ms.Task) -> int:
            return len(task.payload["parts"])

        handlers = {"range": process_range, "join": join}
        async with contextlib.AsyncExitStack() as stack:
            for n in range(4):
                options = ms.WorkerOptions(worker_id=f"worker-{n}", max_running=3)
                await stack.enter_async_context(sched.consumer(handlers, options=options))
            keys = [f"range:{n}" for n in range(RANGES)]
            ranges = await sched.wait_many(keys, timeout=120)  # a bound, not a goal
            # Published by the last range's commit: waited for whether it is there yet or not
            # (a waiter may read a range's success before it sees the commit's other writes on
            # an engine without snapshot isolation, as the wire test engine).
            joined = await sched.wait("join", timeout=120, missing_ok=True)

        barrier = await sched.get("barrier")
        assert barrier is not None
        assert joined.state is ms.TaskState.SUCCESS and joined.result == RANGES
        assert len(barrier.payload["done"]) == RANGES, "a range's output was lost"
        assert all(task.state is ms.TaskState.SUCCESS for task in ranges.values())
        summary = {"ranges": RANGES, "joined_parts": joined.result, "conflicts": conflicts}
        print(f"barrier: {summary}")
        return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="memory://")
    logging.basicConfig(level=logging.WARNING)
    anyio.run(main, parser.parse_args().uri)
