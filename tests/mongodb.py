"""Run the scenario files against a real MongoDB: a replica set, or a sharded cluster's mongos.

Set ``MSCHEDULER_TEST_MONGODB_URI`` (for example ``mongodb://localhost:27017/?replicaSet=rs0``,
what ``docker compose -f docker/compose.yml up -d mongo`` or ``.ci/mongodb replica-set``
starts); otherwise every test here is skipped, and ``pytest -ra`` prints why. The engine is
``mongodb``. The set-up is done here, so a CI job only starts the server:

- each run gets a database of its own (``mscheduler_it_<random>``), dropped at the end, so
  runs on one server (the Python versions of a CI matrix, a developer's shell) never meet;
- each test gets collections of its own in it, dropped after the test; opening a scheduler
  creates the indexes (``Scheduler.connect`` ensures them), as in production;
- on a sharded cluster (the URI names a ``mongos``) each test's tasks collection is sharded
  on ``{key: 1}``, the shard key `docs/scaling.md` states, before its first use;
- a server that is neither a replica set nor a mongos, or that refuses change streams, fails
  the run at once, naming what is missing, rather than each transaction and change stream
  test one by one (or consumers quietly polling instead).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pymongo
import pytest

from mscheduler import constants as c

SKIP_REASON = "MSCHEDULER_TEST_MONGODB_URI is not set: no real MongoDB to run against"
URI_VARIABLE = "MSCHEDULER_TEST_MONGODB_URI"
SHARD_KEY = {"key": 1}  # the unique publish key: every task has one, publish targets it


@pytest.fixture(params=["mongodb"])
def engine(request: pytest.FixtureRequest) -> str:
    if not os.environ.get(URI_VARIABLE):
        pytest.skip(SKIP_REASON)
    return str(request.param)


@pytest.fixture(scope="session")
def mongodb_client() -> Iterator[pymongo.MongoClient[dict[str, Any]]]:
    uri = os.environ.get(URI_VARIABLE)
    if not uri:
        pytest.skip(SKIP_REASON)
    assert uri is not None
    client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
        uri, serverSelectionTimeoutMS=10_000
    )
    try:
        hello = client.admin.command("hello")
    except pymongo.errors.PyMongoError as exc:
        client.close()
        pytest.exit(f"{URI_VARIABLE}: cannot reach MongoDB: {exc}", returncode=2)
    if "setName" not in hello and hello.get("msg") != "isdbgrid":
        client.close()
        pytest.exit(
            f"{URI_VARIABLE}: the server is a standalone mongod; the integration tier needs a "
            "replica set (start mongod with --replSet and run rs.initiate()) or a mongos, "
            "for transactions and change streams",
            returncode=2,
        )
    try:  # change streams on: the consumers must not quietly fall back to polling here
        with client["mscheduler_probe"]["probe"].watch(max_await_time_ms=1) as stream:
            stream.try_next()
    except pymongo.errors.OperationFailure as exc:
        client.close()
        pytest.exit(f"{URI_VARIABLE}: the server refuses change streams: {exc}", returncode=2)
    yield client
    client.close()


@pytest.fixture(scope="session")
def sharded(mongodb_client: pymongo.MongoClient[dict[str, Any]]) -> bool:
    return bool(mongodb_client.admin.command("hello").get("msg") == "isdbgrid")


@pytest.fixture(scope="session")
def server_database(mongodb_client: pymongo.MongoClient[dict[str, Any]]) -> Iterator[str]:
    """A database for this run only, dropped at its end."""
    name = f"mscheduler_it_{uuid.uuid4().hex[:12]}"
    yield name
    mongodb_client.drop_database(name)


@pytest.fixture
def prepare_collection(
    mongodb_client: pymongo.MongoClient[dict[str, Any]], sharded: bool
) -> Callable[[str, str], None]:
    def prepare(database: str, collection: str) -> None:
        if not sharded:
            return  # created with its indexes by the first Scheduler.connect
        # The declared unique index on the shard key first, under its declared name: the
        # shard key then uses it (sharding would otherwise make its own ``key_1``, and the
        # declared one would then conflict with it).
        name, keys, options = next(index for index in c.INDEXES if index[1] == (("key", 1),))
        mongodb_client[database][collection].create_index(list(keys), name=name, **options)
        mongodb_client.admin.command(
            "shardCollection", f"{database}.{collection}", key=SHARD_KEY, unique=True
        )

    return prepare


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Scenarios that do not take an engine are memory-only: tests/unit runs them."""
    skip = pytest.mark.skip(reason="memory-only scenario (no engine fixture): tests/unit runs it")
    for item in items:
        if "integration" in item.path.parts and "engine" not in getattr(item, "fixturenames", ()):
            item.add_marker(skip)
