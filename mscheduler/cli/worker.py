"""`mscheduler worker`: load handlers from an import path and serve them until a signal."""

from __future__ import annotations

import importlib
import signal
from collections.abc import Mapping
from typing import Any

import anyio
import typer
from anyio.abc import TaskStatus

from ..api import Scheduler
from ..consumer.handlers import Handler
from ..errors import ConfigurationError
from ..worker_options import WorkerOptions


def load_handlers(target: str) -> Mapping[str, Any]:
    """``module:attribute``: a mapping of name → handler, or an object with ``.handlers``."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ConfigurationError(f"worker: {target!r} is not module:attribute")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"worker: cannot load {target!r}: {exc}") from exc
    handlers = found if isinstance(found, Mapping) else getattr(found, "handlers", None)
    if not isinstance(handlers, Mapping):
        raise ConfigurationError(f"worker: {target!r} is neither a mapping nor has .handlers")
    return handlers


async def serve_worker(
    sched: Scheduler,
    handlers: Mapping[str, Handler],
    options: WorkerOptions,
    metrics_port: int | None,
) -> None:
    """Run one consumer. The first SIGINT/SIGTERM stops it gracefully, a second at once."""
    metrics = None
    if metrics_port is not None:
        from ..metrics import PrometheusMetrics, refresh_task_counts

        metrics = PrometheusMetrics()
    consumer = sched.consumer(handlers, options=options)
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
            if metrics is not None and metrics_port is not None:
                consumer.stats.observers.append(metrics)
                metrics.serve(metrics_port)
                tg.start_soon(refresh_task_counts, sched, metrics)
                typer.echo(f"metrics on :{metrics_port}/metrics", err=True)
            typer.echo(f"worker {consumer.worker_id} running {', '.join(consumer.names)}", err=True)
            async for signum in signals:
                if consumer.stop_requested:
                    typer.echo("stopping now", err=True)
                    hard_stop.cancel()
                else:
                    said = signal.Signals(signum).name
                    typer.echo(f"{said}: stopping gracefully (again: now)", err=True)
                    consumer.stop()
