"""What a test of code that uses mscheduler needs: time it controls.

Every timer of the library (leases, retry delays, ``not_before``, schedules, `wait`'s
timeout) reads the scheduler's `Clock`. Give ``Scheduler.connect(..., clock=ManualClock())``
and move time with `ManualClock.advance` instead of sleeping; `SystemClock` is the default.
With ``memory://`` (a private in-process database), a test needs no server
(docs/guides/testing.md)."""

from __future__ import annotations

from .clock import Clock, ManualClock, SystemClock

__all__ = ["Clock", "ManualClock", "SystemClock"]
