"""`mscheduler worker`: load handlers from an import path and serve them until a signal."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import traceback
from collections.abc import Mapping
from typing import Any

import anyio
import typer
from anyio.abc import TaskStatus

from ..api import Scheduler
from ..consumer.executor import HURRIED_RELEASE_TIMEOUT_S
from ..consumer.handlers import Handler, Handlers
from ..errors import ConfigurationError
from ..worker_options import WorkerOptions


def load_handlers(target: str) -> Mapping[str, Any]:
    """``module:attribute``: a mapping of name → handler (or `Handlers`), or an object with
    ``.handlers``. The working directory is on the import path, as with ``celery -A`` or
    uvicorn, so ``mscheduler worker myapp.tasks:handlers`` finds ``./myapp``."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"worker: {target!r} is not module:attribute")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigurationError(
                f"worker: cannot load {target!r}: no module {exc.name!r} on the import path "
                f"(run from the directory that holds it, or set PYTHONPATH)"
            ) from exc
        raise ConfigurationError(_raised_on_import(target, exc)) from exc
    except BaseException as exc:  # its own code failed: a SyntaxError, an exception, exit()
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise ConfigurationError(_raised_on_import(target, exc)) from exc
    found = getattr(module, attribute, None)
    if found is None:
        raise ConfigurationError(
            f"worker: cannot load {target!r}: module {module_name} has no {attribute!r}"
        )
    handlers = found if isinstance(found, Mapping) else getattr(found, "handlers", None)
    if not isinstance(handlers, Mapping):
        raise ConfigurationError(f"worker: {target!r} is neither a mapping nor has .handlers")
    return handlers


def _raised_on_import(target: str, exc: BaseException) -> str:
    where = ""
    if isinstance(exc, SyntaxError):
        where = f" ({exc.filename}, line {exc.lineno})"
    else:
        frames = traceback.extract_tb(exc.__traceback__)
        if frames:
            where = f" ({frames[-1].filename}, line {frames[-1].lineno})"
    message = exc.msg if isinstance(exc, SyntaxError) else str(exc)
    return f"worker: importing {target!r} raised {type(exc).__name__}: {message}{where}"


def only(handlers: Mapping[str, Any], names: list[str], target: str) -> Mapping[str, Any]:
    """The handlers of ``names`` alone; a registry keeps its ``retry_on``."""
    unknown = sorted(set(names) - set(handlers))
    if unknown:
        raise ConfigurationError(f"names: no handler for {unknown} in {target!r}")
    if isinstance(handlers, Handlers):
        return handlers.subset(names)
    return {n: h for n, h in handlers.items() if n in names}


def check_metrics_port(port: int | None) -> None:
    if port is not None and not 1 <= port <= 65_535:
        raise ConfigurationError(f"metrics-port: {port} is not a TCP port (1 to 65535)")


async def serve_worker(
    sched: Scheduler,
    handlers: Mapping[str, Handler],
    options: WorkerOptions,
    metrics_port: int | None,
) -> None:
    """Run one consumer. The first SIGINT/SIGTERM stops it gracefully (running handlers get
    the grace period); a second cancels them and releases their leases at once, so another
    worker claims them and no failure is counted; a third exits without waiting."""
    metrics = None
    if metrics_port is not None:
        from ..metrics import PrometheusMetrics

        metrics = PrometheusMetrics()
        try:  # before anything runs: a busy port is the user's error, said in one line
            metrics.serve(metrics_port)
        except OSError as exc:
            raise ConfigurationError(
                f"metrics-port: cannot listen on {metrics_port}: {exc.strerror or exc}"
            ) from exc
        typer.echo(f"metrics on :{metrics_port}/metrics", err=True)
    consumer = sched.consumer(handlers, options=options)
    stopping_now = False
    # Signals are handled before anything says "running", so a supervisor that signals a
    # worker it has just started gets a graceful stop, not a KeyboardInterrupt.
    with (
        anyio.CancelScope() as hard_stop,
        anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals,
    ):
        async with anyio.create_task_group() as tg:

            async def serve(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
                async with consumer:  # returns once the change stream is open
                    task_status.started()
                    await consumer.wait_stopped()
                tg.cancel_scope.cancel()

            await tg.start(serve)
            if metrics is not None:
                from ..metrics import refresh_task_counts

                consumer.stats.observers.append(metrics)
                tg.start_soon(refresh_task_counts, sched, metrics)
            typer.echo(f"worker {consumer.worker_id} running {', '.join(consumer.names)}", err=True)
            async for signum in signals:
                said = signal.Signals(signum).name
                if consumer.stop_requested and stopping_now:
                    typer.echo(f"{said}: exiting without waiting for the releases", err=True)
                    hard_stop.cancel()
                elif consumer.stop_requested:
                    stopping_now = True
                    running = consumer.running
                    typer.echo(
                        f"{said}: stopping now: cancelling {len(running)} running task(s) and "
                        f"releasing their leases (again: exit at once)",
                        err=True,
                    )
                    consumer.stop_now()
                    # The releases are bounded; past them (a database that does not answer),
                    # the process exits and the leases expire.
                    tg.start_soon(_exit_after, hard_stop, HURRIED_RELEASE_TIMEOUT_S + 1.0)
                else:
                    running = consumer.running
                    grace = options.shutdown_grace_ms / 1000
                    waits = (
                        f"waiting up to {grace:g} s for {len(running)} running task(s) "
                        f"({_listed(running)}), then releasing those still running"
                        if running
                        else "no task is running"
                    )
                    typer.echo(f"{said}: stopping gracefully: {waits} (again: now)", err=True)
                    consumer.stop()


def _listed(keys: list[str], shown: int = 5) -> str:
    more = len(keys) - shown
    return ", ".join(keys[:shown]) + (f" and {more} more" if more > 0 else "")


async def _exit_after(scope: anyio.CancelScope, seconds: float) -> None:
    await anyio.sleep(seconds)
    scope.cancel()
