"""Update pipelines built once and filled per call (`queries.templates`): each call gives the
pipeline the builder itself would build, and a builder a template cannot fill is refused."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from mscheduler.queries import derived, lease, stages, tasks
from mscheduler.queries.templates import templated

NOW = dt.datetime(2030, 1, 1, 12, 0, 0, 123000, tzinfo=dt.timezone.utc)
LATER = NOW + dt.timedelta(seconds=7)

CALLS: list[tuple[Any, tuple[Any, ...]]] = [
    (tasks._claim_update, ("w1", "run-a", NOW)),
    (tasks._claim_update, ("w2", "run-b", LATER)),
    (tasks._claim_update_until, ("w1", "run-a", NOW, LATER)),
    (tasks._claim_update_until, ("w2", "run-b", LATER, LATER + dt.timedelta(seconds=1))),
    (lease._extend_lease_to, ("w1", "run-a", NOW, LATER)),
    (lease.success_update, ("w1", "run-a", {"rows": [1, 2]}, NOW)),
    (lease.success_update, ("w2", "run-b", None, LATER)),
    (derived.recompute, (NOW,)),
    (derived.recompute, (LATER, "run-c")),
    (stages.sweep_expired, (LATER,)),
]


@pytest.mark.parametrize(("builder", "args"), CALLS)
def test_a_filled_template_is_the_pipeline_the_builder_builds(builder: Any, args: Any):
    assert builder(*args) == builder.__wrapped__(*args)


def test_pipelines_of_different_calls_share_no_argument():
    first = lease.success_update("w1", "run-a", {"n": 1}, NOW)
    second = lease.success_update("w2", "run-b", {"n": 2}, LATER)
    assert first == lease.success_update.__wrapped__("w1", "run-a", {"n": 1}, NOW)
    assert second == lease.success_update.__wrapped__("w2", "run-b", {"n": 2}, LATER)


def test_a_ping_with_progress_records_it_between_the_lease_and_the_derived_fields():
    plain = lease.ping_update("w1", "run-a", NOW)
    progress = lease.Progress(fraction=0.3, message="a third")
    reported = lease.ping_update("w1", "run-a", NOW, progress)
    assert reported[:2] == plain[:2] and reported[3:] == plain[2:]
    assert reported[2]["$set"]["progress"]["$literal"]["fraction"] == 0.3


def test_a_builder_that_computes_with_an_argument_is_refused():
    @templated
    def shifted(now: dt.datetime) -> list[dict[str, Any]]:
        return [{"$set": {"at": now + dt.timedelta(seconds=1)}}]

    with pytest.raises(TypeError):
        shifted(NOW)


def test_a_builder_that_hides_an_argument_in_a_tuple_is_refused():
    @templated
    def hidden(run_id: str) -> list[dict[str, Any]]:
        return [{"$set": {"pair": (run_id, 1)}}, {"$set": {"run": run_id}}]

    with pytest.raises(TypeError, match="run_id"):
        hidden("run-a")


def test_a_claim_or_ping_until_a_chosen_time_differs_only_in_the_lease_end():
    """A lease owned for a chosen time (`Scheduler.own(lease=...)`) ends then; otherwise the
    claim and the ping are the task's own ``worker_timeout_ms`` ones."""
    for plain, until in (
        (tasks.claim_update("w1", "run-a", NOW), tasks.claim_update("w1", "run-a", NOW, LATER)),
        (lease.ping_update("w1", "run-a", NOW), lease.ping_update("w1", "run-a", NOW, None, LATER)),
    ):
        assert plain != until
        assert str(until).count(repr(LATER)) == 1 and repr(LATER) not in str(plain)
