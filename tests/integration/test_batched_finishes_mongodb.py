"""The batched finishes scenarios (issue 12), unchanged, on a real server (see conftest.py)."""

from tests.unit.test_batched_finishes import *  # noqa: F403
