"""The sync scheduler scenarios, unchanged, on a real server (see conftest.py)."""

from tests.unit.test_sync_scheduler import *  # noqa: F403
