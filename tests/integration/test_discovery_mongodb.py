"""The discovery scenarios, unchanged, on a real server (see conftest.py)."""

from tests.unit.test_discovery import *  # noqa: F403
