"""The OpenTelemetry tracing scenarios, unchanged, on a real server (see conftest.py)."""

from tests.unit.test_tracing import *  # noqa: F403
