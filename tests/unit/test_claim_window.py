"""The window of candidates a batched claim reads (`store.claims`): as wide as what it claims
while no other process takes them from under it, wider while others do, and within it, the
priority order kept."""

from __future__ import annotations

import datetime as dt
from typing import Any

from mscheduler.store.claims import MAX_WINDOW, Window, choose

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def _candidates(*priorities: int) -> list[dict[str, Any]]:
    return [
        {"_id": n, "key": f"t{n}", "options": {"priority": p}, "created_at": T0}
        for n, p in enumerate(priorities)
    ]


def test_a_window_no_wider_than_the_batch_is_claimed_whole():
    documents = _candidates(3, 2, 2, 1)
    assert choose(documents, 4) == documents
    assert choose(documents[:2], 4) == documents[:2]


def test_the_choice_never_passes_over_a_higher_priority_for_a_lower_one():
    documents = _candidates(9, 9, 5, 5, 5, 5, 5, 5, 1, 1, 1, 1)
    for _ in range(200):
        chosen = choose(documents, 4)
        assert [d["options"]["priority"] for d in chosen] == [9, 9, 5, 5]
        assert chosen == sorted(chosen, key=lambda d: d["_id"])  # in claim order


def test_the_choice_spreads_over_the_candidates_of_the_last_priority_it_takes():
    documents = _candidates(*[0] * 32)
    seen = {d["_id"] for _ in range(50) for d in choose(documents, 16)}
    assert len(seen) > 16  # not always the same best 16


def test_the_window_widens_with_each_lost_round_and_narrows_after_calm_ones():
    window = Window()
    window.after_round(16, 16)
    assert window.batches == 1
    window.after_round(16, 0)
    window.after_round(16, 10)
    assert window.batches == 3 and (window.reads, window.lost_reads) == (3, 1)
    for _ in range(10):
        window.after_round(16, 0)
    assert window.batches == MAX_WINDOW
    calm = 0
    while window.batches == MAX_WINDOW:
        window.after_round(16, 16)
        calm += 1
    assert calm > 1 and window.batches == MAX_WINDOW - 1


def test_a_round_whose_reply_was_lost_is_not_counted_as_lost_to_others():
    window = Window()
    window.after_round(16, None)
    assert (window.batches, window.lost_reads, window.lost_candidates) == (1, 0, 0)
