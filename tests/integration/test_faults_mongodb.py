"""The faults scenarios, unchanged, on a real server (see conftest.py)."""

from tests.unit.test_faults import *  # noqa: F403
