"""The worker's pool of child processes for isolated handlers (`handlers.isolated`); the
child's side is `child.py`.

Why a pool of our own rather than ``anyio.to_process.run_sync``: anyio's pool is one per
event loop thread, shared by every caller, with its children reaped only after five idle
minutes or at the loop's end; a worker needs its own (stopped with it), children replaced
after ``max_tasks_per_child`` tasks or past ``max_memory_mb``, progress reports while the
handler runs (anyio's protocol is one request, one reply), the exit code or signal of a
child that died (anyio says only that the worker process broke), and children that end when
the worker is killed while they run a handler (anyio's notice the end of stdin only between
calls). It is built on anyio's process primitives (`anyio.open_process`), as anyio's is.

Invariants:

- A child runs one handler at a time; it is idle in ``_idle`` or lent to exactly one call.
- A call that does not end with a reply (cancelled: a stop, a lost lease, ``timeout_ms``;
  or the child died) kills its child with SIGKILL and waits for it to be reaped before the
  call returns: once the call has returned, no code of that attempt runs, and its slot is
  free.
- The pool holds at most as many children as handlers run at once: the consumer's
  ``max_running`` bounds the calls, and a child is started only for a call about to be made
  that finds none idle (`warm`, before its start is taken, or as it is made). Children start
  lazily, at the first call that needs one.
- `aclose` kills every child; a child whose worker died on its own ends as its command
  pipe closes (`child.py`).
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import signal
import subprocess
from collections.abc import Callable
from typing import Any, NoReturn, cast

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream, Process
from anyio.streams.buffered import BufferedByteReceiveStream

from ..errors import HandlerProcessDied
from ..models import Lease
from . import child as protocol
from .handlers import Isolated

log = logging.getLogger(__name__)

_CLOSE_TIMEOUT_S = 2.0  # real seconds an idle child retired may take to exit before a kill


class ChildTraceback(Exception):
    """The traceback of an exception raised in an isolated handler's process, as text: set as
    the ``__cause__`` of the exception the worker re-raises, so the log shows where it was
    raised."""


def death(returncode: int) -> str:
    """How a child ended, in words: its exit code, or the signal that killed it."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with code {returncode}"


class _Child:
    """One child process and its pipes."""

    def __init__(self, process: Process) -> None:
        self.process = process
        self.pid = process.pid
        self.tasks_run = 0
        self._commands = cast(ByteSendStream, process.stdin)
        self._replies = BufferedByteReceiveStream(cast(ByteReceiveStream, process.stdout))

    @classmethod
    async def start(cls) -> _Child:
        process = await anyio.open_process(
            protocol.command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # the handler's prints and tracebacks go to the worker's stderr
            start_new_session=True,  # a Ctrl-C at the terminal is the worker's to handle
        )
        log.debug("isolated handlers' process %d started", process.pid)
        return cls(process)

    async def call(
        self, isolated: Isolated, lease: Lease, started: Callable[[], None]
    ) -> tuple[bool, Any, int]:
        """Run the handler: (returned?, its result or exception, resident bytes after).
        ``started`` is called as the child begins the handler; progress reports are passed
        to ``lease`` as they come."""
        crossing = Lease(
            key=lease.key, worker_id=lease.worker_id, run_id=lease.run_id, task=lease.task
        )
        await self._send(protocol.encode(("run", isolated.function, crossing)))
        while True:
            message = await self._receive()
            kind = message[0]
            if kind == "started":
                started()
            elif kind == "progress":
                await lease.progress(message[1], message[2])
            elif kind == "return":
                return True, message[1], message[2]
            else:
                error: BaseException = message[1]
                if message[2]:
                    error.__cause__ = ChildTraceback(message[2])
                return False, error, message[3]

    async def _send(self, data: bytes) -> None:
        try:
            await self._commands.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            await self._died()

    async def _receive(self) -> tuple[Any, ...]:
        try:
            header = await self._replies.receive_exactly(protocol.HEADER.size)
            body = await self._replies.receive_exactly(protocol.HEADER.unpack(header)[0])
        except (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError):
            await self._died()
        try:
            message: tuple[Any, ...] = pickle.loads(body)
        except Exception as exc:  # a class the handler's module defines but the worker lacks
            raise TypeError(
                f"the reply of the handler's process cannot be unpickled in the worker: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return message

    async def _died(self) -> NoReturn:
        returncode = await self.process.wait()
        raise HandlerProcessDied(
            f"the handler's process (pid {self.pid}) died: {death(returncode)}"
        ) from None

    async def kill(self) -> None:
        """SIGKILL, then reap it: nothing of what it ran goes on."""
        with anyio.CancelScope(shield=True):
            if self.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    self.process.kill()
            await self.process.wait()
            await self.process.aclose()

    async def close(self) -> None:
        """An idle child: closing its command pipe ends it; a kill if it does not."""
        with anyio.CancelScope(shield=True):
            await self._commands.aclose()
            with anyio.move_on_after(_CLOSE_TIMEOUT_S):
                await self.process.wait()
            await self.kill()


class ProcessPool:
    """The child processes of one consumer's isolated handlers."""

    def __init__(self) -> None:
        self._idle: list[_Child] = []
        self._children: set[_Child] = set()

    @property
    def pids(self) -> set[int]:
        """The process ids of the children alive now, idle or running a handler."""
        return {child.pid for child in self._children}

    async def run(self, isolated: Isolated, lease: Lease, started: Callable[[], None]) -> Any:
        """Run ``isolated`` for ``lease`` in a child: its result, or its exception re-raised.
        ``started``: called as the child begins the handler (a cold child starts later than
        the call, and a start counts against a rate from the handler's real start). A child
        that died raises `HandlerProcessDied`; cancelled, the child is killed."""
        child = await self._lend()
        try:
            returned, value, resident = await child.call(isolated, lease, started)
        except BaseException:
            self._children.discard(child)
            await child.kill()
            raise
        child.tasks_run += 1
        if isolated.wears_out(child.tasks_run, resident):
            log.info(
                "isolated handlers' process %d replaced after %d task(s), %d MB resident",
                child.pid,
                child.tasks_run,
                resident // (1024 * 1024),
                extra={"action": "child_replaced", "pid": child.pid},
            )
            self._children.discard(child)
            await child.close()
        else:
            self._idle.append(child)
        if not returned:
            raise value
        return value

    async def warm(self) -> None:
        """A child idle and ready for the call about to be made (started now if none is): a
        start that counts against a rate is taken after this, so a cold child's start never
        comes between the start taken and the handler's."""
        if not any(child.process.returncode is None for child in self._idle):
            self._idle.append(await self._start())

    async def _lend(self) -> _Child:
        """The child used last (warm), or a new one; an idle child that died meanwhile (killed
        from outside) is dropped, not blamed on the next task."""
        while self._idle:
            child = self._idle.pop()
            if child.process.returncode is None:
                return child
            self._children.discard(child)
            log.warning(
                "isolated handlers' process %d died while idle: %s",
                child.pid,
                death(child.process.returncode),
                extra={"action": "child_died_idle", "pid": child.pid},
            )
            await child.kill()
        return await self._start()

    async def _start(self) -> _Child:
        with anyio.CancelScope(shield=True):  # a started child is always owned by the pool
            child = await _Child.start()
        self._children.add(child)
        return child

    async def aclose(self) -> None:
        """Stop every child (the consumer stops): idle ones, and any a call still holds."""
        children, self._children, self._idle = list(self._children), set(), []
        with anyio.CancelScope(shield=True):
            for child in children:
                await child.kill()
