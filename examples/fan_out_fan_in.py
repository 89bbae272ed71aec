"""Fan-out / fan-in: count words in many documents in parallel, then add the counts up.

One `publish_many` writes a chord: a map task per document and a reduce task that waits for
all of them (blocked until every map succeeded). The reduce reads the maps' results from
their task documents.

    python examples/fan_out_fan_in.py
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import logging
from typing import Any

import anyio

import mscheduler as ms

DOCUMENTS = {f"doc{n}": " ".join(["queue"] * n + ["mongo"] * (n % 3) + ["task"]) for n in range(30)}


async def main(uri: str = "memory://") -> dict[str, Any]:
    async with await ms.Scheduler.connect(uri, collection="fan_out_fan_in") as sched:

        async def count_words(task: ms.Task) -> dict[str, int]:
            return dict(collections.Counter(task.payload["text"].split()))

        async def add_up(task: ms.Task) -> dict[str, int]:
            total: collections.Counter[str] = collections.Counter()
            for part in await sched.store.get_many(task.depends_on):
                total.update(part.result)
            return dict(total)

        maps = [
            ms.TaskSpec(key=f"count:{name}", name="count", payload={"text": text})
            for name, text in DOCUMENTS.items()
        ]
        reduce = ms.TaskSpec(key="count:total", name="add-up")
        await sched.publish_many(ms.chord(maps, reduce))

        handlers = {"count": count_words, "add-up": add_up}
        async with contextlib.AsyncExitStack() as stack:
            for n in range(3):
                options = ms.WorkerOptions(worker_id=f"worker-{n}")
                await stack.enter_async_context(sched.consumer(handlers, options=options))
            total = await sched.wait("count:total", timeout=30)

    expected = dict(collections.Counter(" ".join(DOCUMENTS.values()).split()))
    assert total.state is ms.TaskState.SUCCESS and total.result == expected, total.result
    print(f"fan-out/fan-in: {len(maps)} maps, total {total.result}")
    return {"maps": len(maps), "total": total.result}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="memory://")
    logging.basicConfig(level=logging.WARNING)
    anyio.run(main, parser.parse_args().uri)
