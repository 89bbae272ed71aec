"""The store's declared collection (`TasksCollection`) is what every engine gives: mypy checks
``tests/static/collection_protocol.py``, which hands each engine's collection to the declaration."""

from __future__ import annotations

import pathlib

import pytest

api = pytest.importorskip("mypy.api")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_engine_collection_satisfies_the_declared_protocol() -> None:
    report, errors, status = api.run(
        [
            str(ROOT / "tests" / "static" / "collection_protocol.py"),
            "--config-file",
            str(ROOT / "pyproject.toml"),
        ]
    )
    assert status == 0, report + errors
