"""Issue 14's scenarios (progress, expiry, debounce, pause, limits), on a real server."""

from tests.unit.test_rate_limits import *  # noqa: F403
from tests.unit.test_scheduling_features import *  # noqa: F403
