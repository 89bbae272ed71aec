"""The spread claim policy against greedy claiming, on the real clock. Prints numbers.

    python bench/bench_spread.py                       # the default spread (1 s)
    python bench/bench_spread.py --claim-spread off    # greedy
    python bench/bench_spread.py --uri "mongodb://..."

Each scenario runs its consumers in one process, each on a fresh database:

- ``long burst``: three workers (16 slots each), then six long tasks and three slow ones
  published at once: how many each worker took.
- the drain of 40 short tasks published at once, in seconds, beside peers that cannot take
  them: ``other names`` (one worker serving ``job`` and ``other``, two serving only
  ``other``), ``busy`` (three workers each running one long task), ``peers stopped`` (two
  of three workers stopped just before), ``backlog 3x16`` (1,000 short tasks on three
  workers of 16 slots, published first, timed from the consumers' start).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Sequence

import anyio
from common import counted_scheduler, dispose

import mscheduler as ms

_SHORT = 40


def _options(worker_id: str, spread: int | None, max_running: int = 16) -> ms.WorkerOptions:
    return ms.WorkerOptions(
        worker_id=worker_id, max_running=max_running, claim_spread_ms=spread, poll_interval_ms=100
    )


async def _until(condition, seconds: float = 60.0) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    while not condition():
        if time.perf_counter() - started > seconds:
            raise TimeoutError("the scenario did not finish")
        await anyio.sleep(0.002)
    return time.perf_counter() - started


async def long_burst(uri: str, spread: int | None) -> str:
    sched, counting, connection = await counted_scheduler(uri)
    gate = anyio.Event()
    took: dict[str, int] = {}

    def handler(worker_id: str):  # type: ignore[no-untyped-def]
        async def long(task: ms.Task) -> None:
            took[worker_id] = took.get(worker_id, 0) + 1
            await gate.wait()

        return long

    async with contextlib.AsyncExitStack() as stack:
        for n in range(3):
            worker = f"w{n}"
            consumer = sched.consumer(
                {"export": handler(worker), "slow": handler(worker)},
                options=_options(worker, spread),
            )
            await stack.enter_async_context(consumer)
        await anyio.sleep(1.2)  # a spread: each counts its peers again before it shares out
        await sched.publish_many(
            [ms.TaskSpec(key=f"export:{n}", name="export") for n in range(6)]
            + [ms.TaskSpec(key=f"slow:{n}", name="slow") for n in range(3)]
        )
        await _until(lambda: sum(took.values()) == 9)
        gate.set()
    await dispose(counting, connection)
    return "/".join(str(took.get(f"w{n}", 0)) for n in range(3))


async def short_drain(uri: str, spread: int | None, scenario: str) -> float:
    sched, counting, connection = await counted_scheduler(uri)
    ran: list[str] = []
    gate = anyio.Event()

    async def short(task: ms.Task) -> None:
        ran.append(task.key)

    async def long(task: ms.Task) -> None:
        await gate.wait()

    tasks = 1_000 if scenario == "backlog 3x16" else _SHORT
    keys = [f"s:{n}" for n in range(tasks)]
    started = time.perf_counter()
    async with contextlib.AsyncExitStack() as stack, contextlib.AsyncExitStack() as peers:
        if scenario == "backlog 3x16":  # timed from the consumers' start
            await sched.publish_many(ms.TaskSpec(key=key, name="job") for key in keys)
            started = time.perf_counter()
        consumers = []
        for n in range(3):
            names: Sequence[str] = ("job", "long")
            if scenario == "other names":
                names = ("job", "other") if n == 0 else ("other",)
            handlers = {name: long if name == "long" else short for name in names}
            consumer = sched.consumer(handlers, options=_options(f"w{n}", spread))
            consumers.append(consumer)
            await (peers if n else stack).enter_async_context(consumer)
        if scenario == "busy":
            for n in range(3):
                pin = ms.TaskOptions(specific_worker_ids=[f"w{n}"])
                await sched.publish(f"long:{n}", None, name="long", options=pin)
            await _until(lambda: sum(len(c.running) for c in consumers) == 3)
        if scenario != "backlog 3x16":
            await anyio.sleep(1.2)  # a spread after the start: counts are as old as a spread
            if scenario == "peers stopped":
                await peers.aclose()  # stopped: their entries are removed
            started = time.perf_counter()
            await sched.publish_many(ms.TaskSpec(key=key, name="job") for key in keys)
        await _until(lambda: len(ran) == tasks)
        elapsed = time.perf_counter() - started
        gate.set()
    await dispose(counting, connection)
    return elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="memory://")
    parser.add_argument("--claim-spread", default="default", help="milliseconds, or off")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    spread: int | None
    if args.claim_spread == "default":
        spread = ms.WorkerOptions().claim_spread_ms
    elif args.claim_spread == "off":
        spread = None
    else:
        spread = int(args.claim_spread)
    label = f"claim_spread_ms={spread}"
    for _ in range(args.rounds):
        shares = await long_burst(args.uri, spread)
        print(f"{label} long burst (6 exports + 3 slow on 3 workers): {shares}", flush=True)
        for scenario in ("other names", "busy", "peers stopped", "backlog 3x16"):
            seconds = await short_drain(args.uri, spread, scenario)
            print(f"{label} drain, {scenario}: {seconds:.3f} s", flush=True)


if __name__ == "__main__":
    anyio.run(main)
