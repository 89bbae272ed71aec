"""The mongo shell docs scenarios, unchanged, on a real server (see conftest.py)."""

from tests.unit.test_mongo_shell_docs import *  # noqa: F403
