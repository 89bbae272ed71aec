"""The public API is what the ``__all__`` of the package and of its public submodules say,
every name in them exists, and the names that moved off the top level still work there for
one release, with a warning naming their home."""

from __future__ import annotations

import inspect
import subprocess
import sys
import typing
import warnings
from types import ModuleType
from typing import Any

import pytest
from pydantic import BaseModel

import mscheduler as ms
from mscheduler import browse, collection, errors, handlers, models, testing

PUBLIC_MODULES: dict[str, ModuleType] = {
    "mscheduler": ms,
    "mscheduler.errors": errors,
    "mscheduler.models": models,
    "mscheduler.handlers": handlers,
    "mscheduler.testing": testing,
    "mscheduler.browse": browse,
    "mscheduler.collection": collection,
}
# Reached through a public method, yet internal: `Handlers.spec` serves the consumer only.
# Giving it a private name belongs to the consumer's own change; nothing else may join.
INTERNAL_BUT_REACHABLE = {"HandlerSpec"}
# Defined in a public module, yet internal: a `BackendUnavailable` the claim path raises and
# handles itself (a user sees it as the `BackendUnavailable` it is).
INTERNAL_IN_A_PUBLIC_MODULE = {"ClaimUncertain"}
# Every top-level name of the release before: each is still reachable from the top.
PREVIOUS_TOP_LEVEL = {
    *("Abort", "BackendUnavailable", "Batch", "Clock", "ConfigurationError", "Consumer"),
    *("ConsumerStats", "DependencyError", "ErrorInfo", "Flow", "HandlerProcessDied"),
    *("HandlerSignal", "Handlers", "Isolated", "Lease", "LeaseLost", "Limit"),
    *("MSchedulerError", "ManualClock", "PayloadError", "PreconditionFailed", "Progress"),
    *("PublishResult", "RetryLater", "Schedule", "Scheduler", "StatsRow", "StoreError"),
    *("SyncScheduler", "SystemClock", "Task", "TaskEvent", "TaskEvents", "TaskNotFound"),
    *("TaskOptions", "TaskRunning", "TaskSpec", "TaskState", "TaskTimeout", "WorkerInfo"),
    *("WorkerNotLive", "WorkerOptions", "WorkerState", "WorkerStateKind", "__version__"),
    *("batch", "chain", "chord", "current_lease", "group", "isolated"),
}


def _exported() -> dict[str, Any]:
    """Every public name of every public module, with its value."""
    return {
        name: getattr(module, name) for module in PUBLIC_MODULES.values() for name in module.__all__
    }


@pytest.mark.parametrize("module", PUBLIC_MODULES.values(), ids=PUBLIC_MODULES.keys())
def test_all_names_exist_and_are_listed_once(module: ModuleType) -> None:
    assert len(set(module.__all__)) == len(module.__all__)
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert missing == []


def test_the_top_level_holds_the_names_a_program_needs_first() -> None:
    """About fifteen: the scheduler, the options, the task and its state, specs and flows,
    the handler registry and signals, the base error. The rest are in public submodules."""
    assert {"Scheduler", "SyncScheduler", "Task", "TaskOptions", "MSchedulerError"} <= set(
        ms.__all__
    )
    assert len(ms.__all__) <= 18


def test_every_name_of_a_public_module_is_defined_in_the_package() -> None:
    for name, value in _exported().items():
        module = getattr(value, "__module__", "mscheduler")
        assert module.startswith("mscheduler"), name


def test_every_public_class_of_a_public_submodule_is_exported() -> None:
    for module in PUBLIC_MODULES.values():
        public = {
            name
            for name, value in vars(module).items()
            if isinstance(value, type)
            and not name.startswith("_")
            and value.__module__ == module.__name__
        }
        assert public - INTERNAL_IN_A_PUBLIC_MODULE <= set(module.__all__), module.__name__


def test_every_exception_is_a_library_error_or_a_handler_signal_never_both() -> None:
    exceptions = {
        name: value
        for name in errors.__all__
        if isinstance(value := getattr(errors, name), type) and issubclass(value, BaseException)
    }
    signals = {name for name, e in exceptions.items() if issubclass(e, errors.HandlerSignal)}
    library = {name for name, e in exceptions.items() if issubclass(e, errors.MSchedulerError)}
    assert signals == {"HandlerSignal", "Abort", "RetryLater"}
    assert library == set(exceptions) - signals
    assert errors.TaskTimeout in [exceptions[name] for name in library]  # raised by the consumer


@pytest.mark.parametrize("signal", [ms.Abort("no"), ms.RetryLater(5.0)])
def test_a_handlers_except_mscheduler_error_does_not_swallow_its_signal(
    signal: errors.HandlerSignal,
) -> None:
    """A handler guards its calls to the library with ``except ms.MSchedulerError``; the
    `Abort` or `RetryLater` it raises inside that block must still reach the consumer."""

    def handler() -> str:
        try:
            raise signal  # after some call to the library that may fail
        except ms.MSchedulerError:
            return "swallowed: the task would succeed"

    with pytest.raises(type(signal)):
        handler()


def _classes_in(hint: Any, found: set[type]) -> None:
    for inner in typing.get_args(hint):
        _classes_in(inner, found)
    origin = typing.get_origin(hint) or hint
    if isinstance(origin, type) and origin.__module__.startswith("mscheduler"):
        found.add(origin)


def test_every_type_a_public_name_hands_out_or_takes_is_exported() -> None:
    """What a public method returns or takes, or a public model holds, a user touches: it is
    exported by a public module, so it can be imported, annotated and found in the reference."""
    exported = _exported()
    reached: set[type] = set()
    for value in exported.values():
        if not isinstance(value, type):
            continue
        for attr, member in vars(value).items():
            function = member.fget if isinstance(member, property) else member
            function = getattr(function, "__func__", function)  # class and static methods
            if attr.startswith(("_", "model_")) or not callable(function):  # model_: pydantic
                continue
            for hint in typing.get_type_hints(function).values():
                _classes_in(hint, reached)
        if issubclass(value, BaseModel):
            for field, info in value.model_fields.items():
                if not field.startswith("_"):
                    _classes_in(info.annotation, reached)
    internal = {cls.__qualname__ for cls in reached if cls.__name__.startswith("_")}
    unexported = {cls.__qualname__ for cls in reached} - internal - set(exported)
    assert unexported == INTERNAL_BUT_REACHABLE


def test_importing_the_package_loads_none_of_its_modules() -> None:
    """The names load on first use (so the command starts fast): importing the package
    imports nothing of it but its version."""
    code = "import sys, mscheduler; print(sorted(m for m in sys.modules if 'mscheduler' in m))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert loaded.stdout.split() == ["['mscheduler',", "'mscheduler.__about__']"]


def test_every_top_level_name_loads_from_its_declaration() -> None:
    """In a fresh process, each name of ``__all__`` (read from the ``TYPE_CHECKING`` imports)
    loads, with no warning."""
    code = "import mscheduler as ms; print(all(getattr(ms, n) is not None for n in ms.__all__))"
    loaded = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True
    )
    assert loaded.stdout.split() == ["True"], loaded.stderr


def test_a_name_of_the_previous_release_is_still_reachable_from_the_top() -> None:
    moved = PREVIOUS_TOP_LEVEL - set(ms.__all__)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert all(getattr(ms, name, None) is not None for name in moved)
    assert set(ms._MOVED) == moved


@pytest.mark.parametrize("name", sorted(ms._MOVED))
def test_a_moved_name_warns_and_names_its_new_home(name: str) -> None:
    home = PUBLIC_MODULES[f"mscheduler.{ms._MOVED[name]}"]
    with pytest.warns(DeprecationWarning, match=rf"mscheduler\.{ms._MOVED[name]}\.{name}\b"):
        value = getattr(ms, name)
    assert value is getattr(home, name)
    assert name in home.__all__


def test_a_name_that_never_existed_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        ms.NoSuchName  # type: ignore[attr-defined]  # noqa: B018


PROBE = """
import mscheduler as ms


async def calls(sched: ms.Scheduler, sync: ms.SyncScheduler) -> None:
    await sched.publish("k", name="n", delay="soon")
    await sched.publish("k", name="n", no_such_option=True)
    await sched.schedule("s", name="n", catch_up="sometimes")
    sync.publish("k", name="n", update_payload="yes")
    sync.retry(42)
    await sched.publish("k", name="n", delay=5, depends_on=["a"], update_payload=True)
    sync.schedule("s", name="n", every=None, jitter=None)
"""


def test_the_type_checker_checks_every_call_of_publish_and_schedule(tmp_path: Any) -> None:
    """The options of publish and schedule are declared once (`models.PublishParams`,
    `ScheduleParams`) and reach `SyncScheduler` through the async methods' own signatures:
    the type checker still checks each call, blocking or awaited."""
    mypy = pytest.importorskip("mypy.api")
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    report, _, _ = mypy.run([str(probe), "--strict", "--no-error-summary"])
    # By line: mypy's cache may replay a probe of the same text under an earlier path.
    codes = {
        int(line.partition("probe.py:")[2].split(":")[0]): line.rpartition("[")[2].rstrip("]")
        for line in report.splitlines()
        if "probe.py:" in line and ": error:" in line
    }
    assert codes == {6: "arg-type", 7: "call-arg", 8: "arg-type", 9: "arg-type", 10: "arg-type"}


def test_the_round_trip_counter_still_loads_from_testing_with_a_warning() -> None:
    from mscheduler.backends.counting import CountingCollection

    with pytest.warns(DeprecationWarning, match=r"mscheduler\.backends\.counting"):
        assert testing.CountingCollection is CountingCollection  # type: ignore[attr-defined]


def test_dir_of_the_package_shows_its_public_names_only() -> None:
    """What ``dir(mscheduler)`` (and so a REPL's completion) offers: the top-level API and
    the public submodules, each reachable from the package; not the names its own code
    imports (``TYPE_CHECKING``, ``functools``, ``warnings``)."""
    shown = set(dir(ms))
    public_modules = {name.rpartition(".")[2] for name in PUBLIC_MODULES if "." in name}
    assert shown == {*ms.__all__, *public_modules}
    for name in shown:
        assert getattr(ms, name) is not None


def _keywords(function: Any) -> set[str]:
    """The keyword options ``function`` takes: its keyword-only parameters, and the fields
    of the declaration its ``**params: Unpack[...]`` names."""
    hints = typing.get_type_hints(function)
    found: set[str] = set()
    for name, parameter in inspect.signature(function).parameters.items():
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY:
            found.add(name)
        elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
            (declared,) = typing.get_args(hints[name])
            found |= set(typing.get_type_hints(declared))
    return found


def test_connect_takes_the_same_options_blocking_or_not() -> None:
    """`ConnectParams` declares them once: an option added to one ``connect`` alone (a
    keyword of its own) is one the other lacks."""
    declared = set(typing.get_type_hints(models.ConnectParams))
    assert _keywords(ms.Scheduler.connect) == _keywords(ms.SyncScheduler.connect) == declared


def test_own_takes_the_options_the_owner_reads() -> None:
    """`OwnParams` declares them once for `Scheduler.own` (and so `SyncScheduler.own`) and
    the owner that reads them."""
    from mscheduler.consumer.owner import Owner

    declared = set(typing.get_type_hints(models.OwnParams))
    assert _keywords(ms.Scheduler.own) == _keywords(Owner.own) == declared


def test_replace_takes_every_option_of_the_task_it_publishes() -> None:
    """`TaskParams` declares what a task is published with; `PublishSpec.of` reads them, and
    takes besides only what decides how ``publish`` treats the key it finds."""
    from mscheduler.specs import PublishSpec

    declared = set(typing.get_type_hints(models.TaskParams))
    publish_only = {"update_payload", "replace_finished", "debounce"}
    assert _keywords(ms.Scheduler.replace) == _keywords(PublishSpec.of) - publish_only
    assert _keywords(ms.Scheduler.replace) == {"name", *declared}
    assert declared <= set(typing.get_type_hints(models.PublishParams))
