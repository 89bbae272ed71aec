"""The examples run on the embedded backend and check their own outcome (they assert)."""

from __future__ import annotations

import importlib.util
import pathlib
from types import ModuleType

import pytest

pytestmark = pytest.mark.anyio
EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_branch_export_serialises_exports_and_ends_at_the_latest_commit():
    summary = await load("branch_export").main()
    assert summary["exported"] == ["c1", "c3"]


async def test_barrier_joins_every_range_despite_contention():
    summary = await load("barrier").main()
    assert summary["joined_parts"] == summary["ranges"]


async def test_config_task_redoes_work_done_with_a_stale_config():
    summary = await load("config_task").main()
    assert summary["redone_after_config_change"] > 0


async def test_quickstart_runs(capsys: pytest.CaptureFixture[str]):
    await load("quickstart").main("memory://")
    out = capsys.readouterr().out
    assert "email:bounce    fail" in out and "email:urgent    success" in out


async def test_webapp_double_submits_send_one_email_each():
    summary = await load("webapp").main()
    assert summary["emails_sent"] == summary["requests"] // 2


async def test_fan_out_fan_in_adds_up_every_map():
    summary = await load("fan_out_fan_in").main()
    assert summary["maps"] == 30
