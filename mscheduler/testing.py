"""What a test of code that uses mscheduler needs: time it controls.

Every timer of the library (leases, retry delays, ``not_before``, schedules, `wait`'s
timeout) reads the scheduler's `Clock`. Give ``Scheduler.connect(..., clock=ManualClock())``
and move time with `ManualClock.advance` instead of sleeping; `SystemClock` is the default.
With ``memory://`` (a private in-process database), a test needs no server
(docs/guides/testing.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .clock import Clock, ManualClock, SystemClock

__all__ = ["Clock", "ManualClock", "SystemClock"]


if not TYPE_CHECKING:  # hidden from type checkers, which see only the names above

    def __getattr__(name: str) -> object:
        # `CountingCollection` (the benchmarks' round-trip counter) lived here: it still loads,
        # with a warning, for one release.
        if name == "CountingCollection":
            import warnings

            from .backends.counting import CountingCollection

            warnings.warn(
                "mscheduler.testing.CountingCollection is internal now "
                "(mscheduler.backends.counting.CountingCollection); "
                "the name goes in the next release",
                DeprecationWarning,
                stacklevel=2,
            )
            return CountingCollection
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
