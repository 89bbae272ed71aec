"""A consumer of more than 100 names: its claims and fetches query at most 100 names at a time
(beyond that MongoDB's planner sorts every due task of those names in memory, on every
claim), and still take the best task of all its names."""

from __future__ import annotations

from typing import Any

import pytest

import mscheduler as ms

pytestmark = pytest.mark.anyio
NAMES = [f"n{i:03d}" for i in range(250)]


def recording(scheduler: ms.Scheduler) -> list[int]:
    """The number of names in each query of tasks by name the store sends from now on."""
    collection = scheduler.store.collection
    sizes: list[int] = []

    def wrap(method: Any) -> Any:
        def recorded(filter: Any, *args: Any, **kwargs: Any) -> Any:
            names = filter.get("name") if isinstance(filter, dict) else None
            if isinstance(names, dict) and "$in" in names:
                sizes.append(len(names["$in"]))
            return method(filter, *args, **kwargs)

        return recorded

    for name in ("find", "find_one_and_update"):
        setattr(collection, name, wrap(getattr(collection, name)))
    return sizes


async def test_claims_and_fetches_of_many_names_query_at_most_100_at_a_time(
    scheduler: ms.Scheduler,
):
    specs = [
        ms.TaskSpec(
            key=f"k{i}",
            name=name,
            options=ms.TaskOptions(priority=5 if name == NAMES[-1] else 0),
        )
        for i, name in enumerate(NAMES)
    ]
    await scheduler.publish_many(specs)
    sizes = recording(scheduler)

    lease = await scheduler.store.tasks.claim("w", names=NAMES)
    assert lease is not None and lease.key == "k249", "the best of all names, in the last group"
    leases = await scheduler.store.tasks.claim_many("w", names=NAMES, limit=4)
    assert [lease.key for lease in leases] == ["k0", "k1", "k2", "k3"], "oldest first"
    fetched = await scheduler.store.fetch(NAMES, "other", 1_000, 100)
    pending = {task.key for task in fetched if task.state is ms.TaskState.PENDING}
    assert pending == {f"k{i}" for i in range(4, 249)}

    assert sizes and max(sizes) <= 100
