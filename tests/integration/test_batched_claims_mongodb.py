"""The batched claims scenarios (issue 12), unchanged, on a real server (see conftest.py)."""

from tests.unit.test_batched_claims import *  # noqa: F403
