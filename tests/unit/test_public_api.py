"""The public API is what ``__all__`` says, and every name in it exists."""

from __future__ import annotations

import mscheduler as ms


def test_all_names_exist_and_are_listed_once():
    assert len(set(ms.__all__)) == len(ms.__all__)
    missing = [name for name in ms.__all__ if not hasattr(ms, name)]
    assert missing == []


def test_every_public_class_is_exported():
    public = {
        name
        for name, value in vars(ms).items()
        if isinstance(value, type) and not name.startswith("_")
    }
    assert public <= set(ms.__all__)


def test_errors_share_one_base():
    errors = [getattr(ms, n) for n in ms.__all__ if n.endswith(("Error", "Lost", "Running"))]
    errors += [ms.TaskNotFound, ms.BackendUnavailable]
    assert all(issubclass(e, ms.MSchedulerError) for e in errors)


def test_every_exported_name_is_loaded_on_first_use():
    """The package loads its modules lazily (so the command starts fast): each name of
    ``__all__`` has a home, and nothing else is listed."""
    assert set(ms._HOMES) == set(ms.__all__) - {"__version__"}
    assert all(getattr(ms, name) is not None for name in ms._HOMES)
