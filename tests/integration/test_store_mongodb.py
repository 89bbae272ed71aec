"""The unit store scenarios, unchanged, on a real server (see conftest.py)."""

from tests.unit.test_store import *  # noqa: F403
