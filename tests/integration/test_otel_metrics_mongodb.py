"""The OpenTelemetry metrics scenarios, unchanged, on a real server (see conftest.py)."""

from tests.unit.test_otel_metrics import *  # noqa: F403
