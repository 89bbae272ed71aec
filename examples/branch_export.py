"""lakeFS's branch export, on mscheduler: one export per branch at a time, latest commit wins.

Tasks per branch (the design's names; the branch is part of each key):
- ``next-export:B`` is *replaced* on every commit with the newest commit, depending on
  ``done-export:B``: while an export runs it waits, and commits that arrive meanwhile collapse
  into one export of the latest.
- ``start-export:B`` re-arms ``done-export:B`` and publishes, in one all-or-nothing batch, a
  copy task per object and a ``_SUCCESS`` marker per prefix that depends on that prefix's
  copies; ``done-export:B`` depends on all of them, and a manifest depends on it.
- ``next-export:B`` starts the next ``start-export:B`` only once the previous export ended
  (the design leaves a window there; the handler closes it with `RetryLater`).

    python examples/branch_export.py
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
from typing import Any

import anyio

import mscheduler as ms
from mscheduler.errors import TaskRunning

BRANCH = "main"
COMMITS: dict[str, dict[str, str]] = {
    f"c{n}": {
        f"{prefix}/{name}": f"{prefix}/{name}@c{n}"
        for prefix in ("sales", "logs/2026", "logs/2027")
        for name in ("a.csv", "b.csv", "c.csv")
    }
    for n in (1, 2, 3)
}


class Destination:
    """The bucket we export to, and a record of what happened when."""

    def __init__(self) -> None:
        self.objects: dict[str, str] = {}
        self.clock = itertools.count()
        self.copies: dict[tuple[str, str], tuple[int, int]] = {}  # (commit, path) → span
        self.markers: list[tuple[str, str, int]] = []
        self.manifests: list[str] = []


async def main(uri: str = "memory://") -> dict[str, Any]:
    bucket = Destination()
    async with await ms.Scheduler.connect(uri, collection="branch_export") as sched:

        async def export(commit: str) -> None:
            """Called on every commit (under the branch's commit lock, in lakeFS)."""
            while True:
                try:
                    await sched.replace(
                        f"next-export:{BRANCH}",
                        {"branch": BRANCH, "commit": commit},
                        name="next-export",
                        depends_on=[f"done-export:{BRANCH}"],
                        allow_missing=True,  # the first export has nothing to wait for
                    )
                    return
                except TaskRunning:  # it is starting the previous export right now
                    await anyio.sleep(0.005)

        async def next_export(task: ms.Task) -> None:
            for key in (f"start-export:{BRANCH}", f"done-export:{BRANCH}"):
                previous = await sched.get(key)
                if previous is not None and not previous.state.is_terminal:
                    raise ms.RetryLater(0.01, f"{key} has not ended yet")
            await sched.publish(
                f"start-export:{BRANCH}", task.payload, name="start-export", replace_finished=True
            )

        async def start_export(task: ms.Task) -> None:
            commit = task.payload["commit"]
            objects = COMMITS[commit]
            copies = [
                ms.TaskSpec(
                    key=f"copy:{commit}:{path}",
                    name="copy",
                    payload={"commit": commit, "path": path},
                )
                for path in objects
            ]
            markers = [
                ms.TaskSpec(
                    key=f"success:{commit}:{prefix}",
                    name="success-marker",
                    payload={"commit": commit, "prefix": prefix},
                    depends_on=tuple(
                        c.key for c in copies if c.payload["path"].startswith(prefix + "/")
                    ),
                )
                for prefix in sorted({path.rsplit("/", 1)[0] for path in objects})
            ]
            await sched.publish_many([*copies, *markers])
            await sched.replace(
                f"done-export:{BRANCH}",
                {"commit": commit},
                name="done-export",
                depends_on=[spec.key for spec in (*copies, *markers)],
            )
            await sched.publish(
                f"manifest:{commit}",
                {"commit": commit},
                name="manifest",
                depends_on=[f"done-export:{BRANCH}"],
            )

        async def copy(task: ms.Task) -> None:
            commit, path = task.payload["commit"], task.payload["path"]
            started = next(bucket.clock)
            await anyio.sleep(0.001)
            bucket.objects[path] = COMMITS[commit][path]
            bucket.copies[commit, path] = (started, next(bucket.clock))

        async def success_marker(task: ms.Task) -> None:
            commit, prefix = task.payload["commit"], task.payload["prefix"]
            bucket.markers.append((commit, prefix, next(bucket.clock)))

        async def done_export(task: ms.Task) -> None:
            return None

        async def manifest(task: ms.Task) -> None:
            bucket.manifests.append(task.payload["commit"])

        handlers = {
            "next-export": next_export,
            "start-export": start_export,
            "copy": copy,
            "success-marker": success_marker,
            "done-export": done_export,
            "manifest": manifest,
        }
        async with contextlib.AsyncExitStack() as stack:
            for n in range(3):
                options = ms.WorkerOptions(worker_id=f"worker-{n}", max_running=4)
                await stack.enter_async_context(sched.consumer(handlers, options=options))
            await export("c1")
            await sched.wait(f"start-export:{BRANCH}", timeout=30, missing_ok=True)
            await export("c2")  # both arrive during c1's export: they collapse into c3
            await export("c3")
            await sched.wait("manifest:c3", timeout=30, missing_ok=True)

    # What a user of branch export relies on:
    assert bucket.objects == COMMITS["c3"], "the destination must end at the latest commit"
    exported = sorted({commit for commit, _ in bucket.copies})
    assert exported == ["c1", "c3"], f"c2 should have been superseded by c3, got {exported}"
    c1_end = max(end for (commit, _), (_, end) in bucket.copies.items() if commit == "c1")
    c3_start = min(start for (commit, _), (start, _) in bucket.copies.items() if commit == "c3")
    assert c1_end < c3_start, "two exports of one branch overlapped"
    assert len(bucket.markers) == 6
    for commit, prefix, at in bucket.markers:
        under = [
            end
            for (c, path), (_, end) in bucket.copies.items()
            if c == commit and path.startswith(prefix + "/")
        ]
        assert len(under) == 3 and at > max(under), f"_SUCCESS of {prefix} before its copies"
    assert sorted(bucket.manifests) == ["c1", "c3"]
    summary = {"exported": exported, "objects": len(bucket.objects), "markers": len(bucket.markers)}
    print(f"branch export: {summary}")
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="memory://")
    logging.basicConfig(level=logging.WARNING)
    anyio.run(main, parser.parse_args().uri)
