"""The child process side of isolated handlers (`isolation.py` is the worker's side).

A child serves one worker: it reads commands from its stdin pipe and answers on its stdout
pipe, each message a pickled tuple behind an 8-byte length (`HEADER`):

- worker → child: ``("run", function, lease)``, one at a time;
- child → worker: ``("started",)`` as the handler begins (a start counts against its name's
  rate from then), ``("progress", fraction, message)`` any number of times while it runs,
  then ``("return", result, resident_bytes)`` or ``("raise", error, traceback_text,
  resident_bytes)``.

The handler runs in a worker thread of the child's event loop, as a plain ``def`` handler runs
in the worker: ``ms.current_lease()`` works there, and ``anyio.from_thread.run(lease.progress,
...)`` reports progress, which the worker writes with the lease's next ping.

A child never outlives its worker: the end of its command pipe (the worker exited, or was
killed with ``kill -9``, and the kernel closed the pipe) ends it at once, handler running or
not, and so does a change of its parent process (a pipe whose write end leaked elsewhere).
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import sys
import traceback
from collections.abc import Callable
from typing import IO, Any

import anyio
import anyio.to_thread

from .. import context
from ..models import Lease, Task

HEADER = struct.Struct(">Q")  # the length of the pickled message that follows
PARENT_CHECK_S = 1.0  # how often a child looks whether its parent process changed

# How the worker starts a child: its own import path first (the handlers' modules are found
# as the worker found them), then `main`.
BOOT = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
    "from mscheduler.consumer.child import main; main()"
)


def command() -> list[str]:
    """The command line of a child of this process."""
    return [sys.executable, "-u", "-c", BOOT, json.dumps(sys.path)]


def encode(message: tuple[Any, ...]) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


def _read_exactly(stream: IO[bytes], size: int) -> bytes | None:
    """``size`` bytes, or None at the end of the stream."""
    chunks = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _read_body(stream: IO[bytes]) -> bytes | None:
    """The next message's pickled body, or None at the end of the stream."""
    header = _read_exactly(stream, HEADER.size)
    if header is None:
        return None
    return _read_exactly(stream, HEADER.unpack(header)[0])


def resident_bytes() -> int:
    """This process's resident memory now (Linux), or its peak where /proc is missing."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows: no bound can be checked
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class _Replies:
    """The reply pipe. Written from the event loop's thread alone (progress comes through
    ``anyio.from_thread.run``), so messages never interleave."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def send(self, message: tuple[Any, ...]) -> None:
        data = encode(message)
        while data:
            data = data[os.write(self._fd, data) :]


def _crossing(error: BaseException) -> BaseException:
    """``error`` if it is an `Exception` that survives pickling both ways, else a
    RuntimeError that names it: the worker raises what it receives where a failed attempt is
    expected, and a ``KeyboardInterrupt`` there would end the worker, not the attempt."""
    if not isinstance(error, Exception):
        return RuntimeError(f"the handler raised {type(error).__qualname__}: {error}")
    try:
        pickle.loads(pickle.dumps(error, protocol=pickle.HIGHEST_PROTOCOL))
        return error
    except Exception:
        name = f"{type(error).__module__}.{type(error).__qualname__}"
        return RuntimeError(f"{name}: {error} (the exception could not be pickled)")


async def _run(function: Callable[[Task], Any], lease: Lease, replies: _Replies) -> None:
    def progressed() -> None:
        reported = lease.reported_progress
        if reported is not None:
            replies.send(("progress", reported.fraction, reported.message))

    lease.on_progress(progressed)
    token = context.enter(context.Run(lease))
    try:
        replies.send(("started",))
        result = await anyio.to_thread.run_sync(function, lease.task)
    except SystemExit as exc:  # sys.exit() in the handler: this process ends, as it asked
        os._exit(exc.code if isinstance(exc.code, int) else 1)
    except BaseException as exc:
        text = "".join(traceback.format_exception(exc))
        replies.send(("raise", _crossing(exc), text, resident_bytes()))
        return
    finally:
        context.leave(token)
    try:
        replies.send(("return", result, resident_bytes()))
    except Exception as exc:  # the result cannot be pickled
        error = TypeError(f"the handler's result cannot cross to the worker: {exc}")
        replies.send(("raise", error, "", resident_bytes()))


async def _watch_parent(parent: int) -> None:
    """A poll: no event says that a parent process changed."""
    while os.getppid() == parent:  # noqa: ASYNC110
        await anyio.sleep(PARENT_CHECK_S)
    os._exit(0)


async def _serve(commands: IO[bytes], replies: _Replies) -> None:
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(_watch_parent, os.getppid())
        while True:
            body = await anyio.to_thread.run_sync(_read_body, commands, abandon_on_cancel=True)
            if body is None:
                os._exit(0)  # the worker is gone or closed the pipe: stop, mid-handler too
            try:
                _, function, lease = pickle.loads(body)
            except Exception as exc:  # the handler's module failed to import here, say
                text = "".join(traceback.format_exception(exc))
                replies.send(("raise", _crossing(exc), text, resident_bytes()))
                continue
            task_group.start_soon(_run, function, lease, replies)


def main() -> None:
    """A child's life: the protocol's pipes are moved off fds 0 and 1, so what the handler
    (or a C library) reads or prints cannot touch them; its prints go to the worker's
    stderr."""
    commands = os.fdopen(os.dup(0), "rb", buffering=0)
    replies = _Replies(os.dup(1))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    anyio.run(_serve, commands, replies)
