"""The limits regressions (issue 15), unchanged, on a real server (see conftest.py)."""

from tests.unit.test_limits import *  # noqa: F403
