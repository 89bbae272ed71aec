"""mscheduler: a reliable multi-worker task scheduler on a MongoDB collection.

The names a program needs first are here; the rest live in public submodules:
`mscheduler.errors` (every exception), `mscheduler.models` (what the API returns: leases,
results, stats, workers, limits, events), `mscheduler.handlers` (what handlers and their
consumers use: ``isolated``, ``batch``, the consumer), `mscheduler.browse` (the operator's
reads of the queue, `Scheduler.browse`) and `mscheduler.testing` (the clocks).

The imports under ``TYPE_CHECKING`` below are the one declaration of the top-level API: the
type checker reads them, and at run time `_public` reads the same lines to load each name
when first used (PEP 562), so ``mscheduler --version`` or a command that only publishes does
not pay for the consumer's modules. ``__all__`` is derived from them too."""

from __future__ import annotations

import functools
import importlib
import logging as _logging
import warnings
from typing import TYPE_CHECKING

from .__about__ import __version__ as __version__

if TYPE_CHECKING:
    from .api import Scheduler as Scheduler
    from .consumer.handlers import Handlers as Handlers
    from .context import current_lease as current_lease
    from .errors import Abort as Abort
    from .errors import MSchedulerError as MSchedulerError
    from .errors import RetryLater as RetryLater
    from .models import Task as Task
    from .models import TaskOptions as TaskOptions
    from .models import TaskState as TaskState
    from .periodic import Schedule as Schedule
    from .specs import Flow as Flow
    from .specs import TaskSpec as TaskSpec
    from .specs import chain as chain
    from .specs import chord as chord
    from .specs import group as group
    from .sync_scheduler import SyncScheduler as SyncScheduler
    from .worker_options import WorkerOptions as WorkerOptions

# Names that were top-level before and now live only in a public submodule: they still work
# from here for one release, with a `DeprecationWarning` naming their home.
_MOVED = {
    **dict.fromkeys(("Clock", "ManualClock", "SystemClock"), "testing"),
    **dict.fromkeys(
        ("Batch", "batch", "Consumer", "ConsumerStats", "Isolated", "isolated", "TaskEvents"),
        "handlers",
    ),
    **dict.fromkeys(
        (
            "BackendUnavailable",
            "ConfigurationError",
            "DependencyError",
            "HandlerProcessDied",
            "HandlerSignal",
            "LeaseLost",
            "PayloadError",
            "PreconditionFailed",
            "StoreError",
            "TaskNotFound",
            "TaskRunning",
            "TaskTimeout",
            "WorkerNotLive",
        ),
        "errors",
    ),
    **dict.fromkeys(
        (
            "ErrorInfo",
            "Lease",
            "Limit",
            "Progress",
            "PublishResult",
            "StatsRow",
            "TaskEvent",
            "WorkerInfo",
            "WorkerState",
            "WorkerStateKind",
        ),
        "models",
    ),
}


# The public submodules: attributes of the package (``ms.errors.TaskNotFound``), imported at
# their first use.
_SUBMODULES = ("browse", "collection", "errors", "handlers", "models", "testing")


@functools.cache
def _public() -> dict[str, str]:
    """Each top-level name and the module it is loaded from, as the ``TYPE_CHECKING`` imports
    of this file declare them (read once, at the first use of a name)."""
    import ast  # here: its import would cost every run of the command

    source = __loader__.get_source(__name__)  # type: ignore[name-defined]  # set by import
    homes: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom) and statement.level == 1
                for alias in statement.names:
                    homes[alias.asname or alias.name] = f".{statement.module}"
    return homes


# Hidden from type checkers: to them the module has exactly the names declared above, so a
# typo, or a name that moved, is reported where it is used.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        if name == "__all__":
            return sorted(["__version__", *_public()])
        home = _public().get(name)
        if home is None and name in _MOVED:
            home = f".{_MOVED[name]}"
            warnings.warn(
                f"mscheduler.{name} moved to mscheduler.{_MOVED[name]}.{name}; "
                f"the top-level name goes in the next release",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(importlib.import_module(home, __name__), name)
        if home is None and name in _SUBMODULES:
            return importlib.import_module(f".{name}", __name__)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, __name__), name)
        globals()[name] = value  # loaded once: later uses are plain attribute reads
        return value


def __dir__() -> list[str]:
    """The public names only: not the ones this module's own code imports."""
    return sorted({"__version__", *_public(), *_SUBMODULES})


# A library logs, the application decides where to: no "No handlers could be found" noise,
# no output unless the application configures logging.
_logging.getLogger(__name__).addHandler(_logging.NullHandler())
