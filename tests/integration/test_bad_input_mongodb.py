"""The bad input scenarios, unchanged, on a real server (see conftest.py)."""

from tests.unit.test_bad_input import *  # noqa: F403
