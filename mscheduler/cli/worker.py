"""`mscheduler worker`: load handlers from an import path and serve them until a signal.

The command loads nothing heavy until it runs (``--help`` needs typer alone), so the library
is imported inside the functions here."""

from __future__ import annotations

import datetime as dt
import importlib
import os
import signal
import sys
import traceback
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .common import fail, flag_words, run
from .inputs import parse_duration

if TYPE_CHECKING:
    import anyio

    from ..api import Scheduler
    from ..worker_options import WorkerOptions

# The options `worker` sets from its flags, named as the flags in its refusals.
WORKER_FLAGS = {
    "max_running": "max-running",
    "worker_id": "worker-id",
    "poll_interval_ms": "poll-interval",
    "shutdown_grace_ms": "grace",
    "claim_spread_ms": "claim-spread",
    "heartbeat_ms": "heartbeat",
    "max_tasks": "max-tasks",
}


def register(app: typer.Typer) -> None:
    @app.command()
    def worker(
        ctx: typer.Context,
        target: Annotated[str, typer.Argument(help="module:handlers")],
        worker_id: Annotated[str | None, typer.Option(envvar="MSCHEDULER_WORKER_ID")] = None,
        max_running: Annotated[int, typer.Option(envvar="MSCHEDULER_MAX_RUNNING")] = 16,
        names: Annotated[
            list[str] | None, typer.Option(help="Only these names; repeatable.")
        ] = None,
        metrics_port: Annotated[
            int | None, typer.Option(envvar="MSCHEDULER_METRICS_PORT", help="Serve /metrics here.")
        ] = None,
        grace: Annotated[
            str | None,
            typer.Option(
                envvar="MSCHEDULER_GRACE",
                help="How long a first SIGINT/SIGTERM lets running tasks finish before they are "
                "released (30s); a second releases them at once.",
                show_default=False,
            ),
        ] = None,
        claim_spread: Annotated[
            str | None,
            typer.Option(
                envvar="MSCHEDULER_CLAIM_SPREAD",
                help="Share bursts with the other live workers of a name: a busy worker lets "
                "a new task wait this long for an idle one first (1s; keep it above the poll "
                "interval on a server without change streams); `off` or 0: claim as many due "
                "tasks as there are free slots.",
                show_default=False,
            ),
        ] = None,
        heartbeat: Annotated[
            str | None,
            typer.Option(
                envvar="MSCHEDULER_HEARTBEAT",
                help="How often to refresh this worker in `mscheduler workers` (30s).",
                show_default=False,
            ),
        ] = None,
        poll_interval: Annotated[
            str | None,
            typer.Option(
                envvar="MSCHEDULER_POLL_INTERVAL",
                help="How often to look for tasks on a server without change streams (5s).",
                show_default=False,
            ),
        ] = None,
        isolate: Annotated[
            bool,
            typer.Option(
                "--isolate",
                envvar="MSCHEDULER_ISOLATE",
                help="Run every plain def handler in a child process "
                "(as mscheduler.handlers.isolated does): one that crashes or outlives "
                "timeout_ms is killed, not the worker.",
            ),
        ] = False,
        burst: Annotated[
            bool,
            typer.Option(
                "--burst",
                envvar="MSCHEDULER_BURST",
                help="Exit (0) once no task of its names may be claimed now and its running "
                "tasks are done: a drain for CI jobs and cron. Tasks due later do not keep it.",
            ),
        ] = False,
        max_tasks: Annotated[
            int | None,
            typer.Option(
                envvar="MSCHEDULER_MAX_TASKS",
                help="Exit (0) after this many tasks were run.",
                show_default=False,
            ),
        ] = None,
    ) -> None:
        """Run a consumer until SIGINT/SIGTERM: the first lets running tasks finish within
        --grace, then releases the rest; a second cancels them and releases them at once.
        `mscheduler workers stop ID [--now]` stops it the same way from anywhere (exit 0).
        With --burst or --max-tasks it also exits 0 by itself once its work is done.

        TARGET is module:attribute, imported from the current directory: a mapping of task name
        to handler (async or plain functions), an ms.Handlers registry, or an object with
        .handlers. With --isolate, its plain def handlers run in child processes, up to
        --max-running of them at once."""
        from pydantic import ValidationError

        from ..errors import MSchedulerError
        from ..worker_options import WorkerOptions

        try:
            check_metrics_port(metrics_port)
            chosen: dict[str, Any] = {"max_running": max_running, "burst": burst}
            if max_tasks is not None:
                chosen["max_tasks"] = max_tasks
            if worker_id:
                chosen["worker_id"] = worker_id
            if poll_interval:
                interval = parse_duration(
                    poll_interval,
                    "poll-interval",
                    minimum=dt.timedelta(milliseconds=10),
                    maximum=dt.timedelta(days=1),
                )
                chosen["poll_interval_ms"] = round(interval.total_seconds() * 1000)
            if grace:
                wait = parse_duration(
                    grace, "grace", minimum=dt.timedelta(0), maximum=dt.timedelta(days=1)
                )
                chosen["shutdown_grace_ms"] = round(wait.total_seconds() * 1000)
            if claim_spread == "off":
                chosen["claim_spread_ms"] = None
            elif claim_spread:
                spread = parse_duration(
                    claim_spread,
                    "claim-spread",
                    minimum=dt.timedelta(0),
                    maximum=dt.timedelta(days=1),
                )
                spread_ms = round(spread.total_seconds() * 1000)
                chosen["claim_spread_ms"] = spread_ms or None  # 0 turns spreading off
            if heartbeat:
                beat = parse_duration(
                    heartbeat,
                    "heartbeat",
                    minimum=dt.timedelta(milliseconds=10),
                    maximum=dt.timedelta(days=1),
                )
                chosen["heartbeat_ms"] = round(beat.total_seconds() * 1000)
            options = WorkerOptions(**chosen)
            handlers = load_handlers(target)
            if names:
                handlers = only(handlers, names, target)
            if isolate:
                from ..handlers import isolate_plain

                handlers = isolate_plain(handlers)
            if metrics_port is not None:
                from ..observability.prometheus import require_prometheus

                require_prometheus()  # fail now, with a clear line, if the extra is missing
        except (MSchedulerError, ValidationError) as exc:
            fail(flag_words(exc, WORKER_FLAGS))

        async def work(sched: Scheduler) -> None:
            await serve_worker(sched, handlers, options, metrics_port)

        run(ctx, work, private="refuse")


def load_handlers(target: str) -> Mapping[str, Any]:
    """``module:attribute``: a mapping of name → handler (or `Handlers`), or an object with
    ``.handlers``. The working directory is on the import path, as with ``celery -A`` or
    uvicorn, so ``mscheduler worker myapp.tasks:handlers`` finds ``./myapp``."""
    from ..errors import ConfigurationError

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
    from ..errors import ConfigurationError
    from ..handlers import Handlers

    unknown = sorted(set(names) - set(handlers))
    if unknown:
        raise ConfigurationError(f"names: no handler for {unknown} in {target!r}")
    if isinstance(handlers, Handlers):
        return handlers.subset(names)
    return {n: h for n, h in handlers.items() if n in names}


def check_metrics_port(port: int | None) -> None:
    from ..errors import ConfigurationError

    if port is not None and not 1 <= port <= 65_535:
        raise ConfigurationError(f"metrics-port: {port} is not a TCP port (1 to 65535)")


async def serve_worker(
    sched: Scheduler,
    handlers: Mapping[str, Any],
    options: WorkerOptions,
    metrics_port: int | None,
) -> None:
    """Run one consumer. The first SIGINT/SIGTERM stops it gracefully (running handlers get
    the grace period); a second cancels them and releases their leases at once, so another
    worker claims them and no failure is counted; a third exits without waiting. A remote
    stop (`Scheduler.stop_worker`, ``mscheduler workers stop``) ends it the same way, and the
    process exits 0 once the consumer stopped."""
    import anyio
    from anyio.abc import TaskStatus

    from ..constants import HURRIED_RELEASE_TIMEOUT_S
    from ..errors import ConfigurationError
    from ..handlers import Isolated

    metrics = None
    if metrics_port is not None:
        from ..observability.prometheus import PrometheusMetrics

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
                    await consumer.wait_stop_requested()
                    if consumer.done_by_itself is not None:
                        typer.echo(
                            f"worker {consumer.worker_id} done ({consumer.done_by_itself}): "
                            f"{consumer.stats.claimed} task(s) run",
                            err=True,
                        )
                    if consumer.stopped_remotely:
                        typer.echo(
                            f"stop requested (mscheduler workers stop): "
                            f"{len(consumer.running)} running task(s) to finish or release",
                            err=True,
                        )
                tg.cancel_scope.cancel()

            await tg.start(serve)
            if metrics is not None:
                from ..observability.prometheus import refresh_task_counts

                consumer.stats.observers.append(metrics)
                tg.start_soon(refresh_task_counts, sched, metrics)
            isolated = [n for n in consumer.names if isinstance(consumer.handlers[n], Isolated)]
            in_children = f" (in child processes: {', '.join(isolated)})" if isolated else ""
            typer.echo(
                f"worker {consumer.worker_id} running {', '.join(consumer.names)}{in_children}",
                err=True,
            )
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
    import anyio

    await anyio.sleep(seconds)
    scope.cancel()
