"""What OpenTelemetry costs a publish and a run: the same tasks published then run, in a
process of its own per mode (a tracer provider is set once per process):

- ``absent``: opentelemetry cannot be imported (the extra not installed);
- ``api``: opentelemetry-api installed, no provider set (the default for an application
  that has not set tracing up);
- ``sdk``: the SDK's provider with a span processor that drops every span (the spans are
  made, recorded and ended; exporting is the exporter's cost, not ours).

    .venv/bin/python bench/bench_tracing.py [--tasks 500] [--uri memory://]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

MODES = ("absent", "api", "sdk")

CHILD = """
import importlib.abc, json, sys, time
mode, uri, count = sys.argv[1], sys.argv[2], int(sys.argv[3])


class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ImportError(name)
        return None


if mode == "absent":
    sys.meta_path.insert(0, Absent())
if mode == "sdk":
    from opentelemetry import trace
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

    provider = TracerProvider()
    provider.add_span_processor(SpanProcessor())  # the base class: drops every span
    trace.set_tracer_provider(provider)

import anyio

import mscheduler as ms
from mscheduler.models import Lease


async def main() -> None:
    async with await ms.Scheduler.connect(uri, collection=f"bench_tracing_{mode}") as sched:
        started = time.perf_counter()
        for n in range(count):
            await sched.publish(f"t:{n}", {"n": n}, name="job")
        published = time.perf_counter()
        done = anyio.Event()
        ran = 0

        def handler(task: ms.Task) -> None:
            nonlocal ran
            ran += 1
            if ran == count:
                done.set()

        async def job(task: ms.Task) -> None:
            handler(task)

        options = ms.WorkerOptions(worker_id="bench", max_running=16)
        async with sched.consumer({"job": job}, options=options):
            await done.wait()
        finished = time.perf_counter()
        task = await sched.get("t:0")
        if not uri.startswith("memory://"):
            await sched.collection.drop()
    # The hooks alone, without the database: a publish's span and carrier, a run's span.
    from mscheduler.observability import tracing

    lease = Lease(key=task.key, worker_id="bench", run_id="r", task=task)
    rounds = 20_000
    begun = time.perf_counter()
    for _ in range(rounds):
        with tracing.publishing("publish", ["job"], key="t:0"):
            tracing.carrier()
        with tracing.processing(lease, lambda: None):
            pass
    hooks = (time.perf_counter() - begun) / rounds * 1e6
    print(json.dumps({"publish_us": (published - started) / count * 1e6,
                      "run_us": (finished - published) / count * 1e6, "hooks_us": hooks}))


anyio.run(main)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--uri", default="memory://")
    args = parser.parse_args()
    print(f"{args.tasks} tasks on {args.uri.split('?')[0]}, one process per mode")
    print(f"{'mode':<8} {'publish us/task':>16} {'run us/task':>12} {'hooks us/task':>14}")
    for mode in MODES:
        begun = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", CHILD, mode, args.uri, str(args.tasks)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        figures = json.loads(out)
        print(
            f"{mode:<8} {figures['publish_us']:>16.0f} {figures['run_us']:>12.0f}"
            f" {figures['hooks_us']:>14.1f}"
            f"   ({time.perf_counter() - begun:.1f} s)"
        )


if __name__ == "__main__":
    main()
