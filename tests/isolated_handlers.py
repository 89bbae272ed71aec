"""Handlers that the isolated-handler tests run in child processes: module-level functions of
an importable module, since a child imports them by name. Each says which process ran it."""

from __future__ import annotations

import os
import pathlib
import signal
import threading
import time
from typing import Any

import anyio.from_thread

import mscheduler as ms

WAIT_S = 10.0  # real seconds a handler waits for a file the test writes, at most


def _wait_for(path: pathlib.Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)


def pid(task: ms.Task) -> dict[str, Any]:
    """Its process id, the payload back and its lease's run_id."""
    return {"pid": os.getpid(), "payload": task.payload, "run_id": ms.current_lease().run_id}


def exit_3(task: ms.Task) -> None:
    os._exit(3)


def killed(task: ms.Task) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def exits(task: ms.Task) -> None:
    raise SystemExit(5)


def interrupted(task: ms.Task) -> None:
    raise KeyboardInterrupt


def returns_a_lock(task: ms.Task) -> object:
    return threading.Lock()  # cannot be pickled


def fails(task: ms.Task) -> None:
    raise ValueError(f"bad payload {task.payload!r}")


def aborts(task: ms.Task) -> None:
    raise ms.Abort("no use trying again")


def retries_later(task: ms.Task) -> None:
    raise ms.RetryLater(60, "busy")


def stuck(task: ms.Task) -> None:
    """Writes its pid to the file the payload names, then sleeps well past any test."""
    pathlib.Path(task.payload).write_text(str(os.getpid()))
    time.sleep(60)
    pathlib.Path(task.payload + ".woke").write_text("the attempt went on")


def meet(task: ms.Task) -> int:
    """Writes its pid into the folder the payload names and returns once two have."""
    folder = pathlib.Path(task.payload)
    (folder / task.key).write_text(str(os.getpid()))
    deadline = time.monotonic() + WAIT_S
    while len(list(folder.iterdir())) < 2:
        if time.monotonic() > deadline:
            raise TimeoutError("ran alone")
        time.sleep(0.01)
    return os.getpid()


def reports(task: ms.Task) -> int:
    """Reports progress, then returns once the file the payload names exists."""
    anyio.from_thread.run(ms.current_lease().progress, 0.5, "half way")
    _wait_for(pathlib.Path(task.payload))
    return os.getpid()


handlers = {"pid": pid, "exit_3": exit_3, "stuck": stuck}
