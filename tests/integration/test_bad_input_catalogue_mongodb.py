"""The bad input catalogue scenarios, unchanged, on a real server (see conftest.py)."""

from tests.unit.test_bad_input_catalogue import *  # noqa: F403
