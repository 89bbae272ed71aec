"""The conformance suite's endpoint: ``MSCHEDULER_CONFORMANCE_URL`` (and
``MSCHEDULER_CONFORMANCE_TOKEN``) when set, any implementation of the HTTP API; else a server
it starts (`server.py`). Each scenario works on task names of its own, so an endpoint others
use is left as found."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator

import httpx
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


class Endpoint:
    def __init__(self, url: str, token: str | None) -> None:
        self.url = url.rstrip("/")
        self.token = token

    def client(self, token: str | None = "default") -> httpx.Client:
        token = self.token if token == "default" else token
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)


@pytest.fixture(scope="session")
def endpoint() -> Iterator[Endpoint]:
    url = os.environ.get("MSCHEDULER_CONFORMANCE_URL")
    if url:
        yield Endpoint(url, os.environ.get("MSCHEDULER_CONFORMANCE_TOKEN"))
        return
    token = uuid.uuid4().hex
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.conformance.server", token],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert process.stderr is not None
    line = process.stderr.readline()
    assert "serve: http://" in line, line
    try:
        yield Endpoint(line.split("serve: ")[1].split()[0], token)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)


@pytest.fixture
def api(endpoint: Endpoint) -> Iterator[httpx.Client]:
    with endpoint.client() as client:
        yield client


@pytest.fixture
def name() -> str:
    """A task name of the test's own: the suite may run against a shared endpoint."""
    return f"conformance-{uuid.uuid4().hex[:12]}"
