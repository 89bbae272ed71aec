"""The README's test command tells the truth at both ends: its header names the engines and
tiers that will run, its closing lines what did not and the command that runs everything."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from tests.engines import wire_python

ROOT = pathlib.Path(__file__).parents[2]
SMALL = "tests/unit/test_host_guard.py"  # a file of a few fast tests, no engine


def pytest_in_a_subprocess(*args: str, **env: str) -> str:
    """The project's pytest, as a contributor runs it from the clone (not under CI, which
    forces the wire tier on)."""
    environment = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_XDIST_WORKER")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n0", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**environment, **env},
    )
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: no test ran
    return done.stdout


def test_the_header_leaves_out_an_engine_not_chosen():
    out = pytest_in_a_subprocess("--collect-only", "--engine", "memory", SMALL)
    assert "engines: memory; not run: wire (--engine), mongodb (--engine)" in out
    assert "tiers: the README's; not the slow tier" in out


def test_the_header_and_the_end_say_the_wire_tier_does_not_run_without_its_engine(
    tmp_path: pathlib.Path,
):
    missing = str(tmp_path / "no-python")
    out = pytest_in_a_subprocess(
        "tests/scenarios/test_expiry.py", "--engine", "wire", MSCHEDULER_WIRE_PYTHON=missing
    )
    assert "engines: none; not run: memory (--engine), wire (no engine" in out
    assert "not run: 2 tests, wire: no wire engine" in out
    assert "everything: .venv/bin/python -m pytest --slow" in out.splitlines()[-2]


def test_the_header_names_the_wire_engine_that_will_run():
    python = wire_python()
    if python is None or not pathlib.Path(python).exists():
        pytest.skip("no wire engine here (bash .ci/wire-venv)")
    out = pytest_in_a_subprocess("--collect-only", SMALL)
    assert f"engines: memory, wire ({python}); not run: mongodb" in out
