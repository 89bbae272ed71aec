"""The batches scenarios, unchanged, on a real server (see conftest.py)."""

from tests.unit.test_batches import *  # noqa: F403
