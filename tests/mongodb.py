"""The ``mongodb`` engine: the scenario tree against a real MongoDB, a replica set or a sharded
cluster's mongos, when ``MSCHEDULER_TEST_MONGODB_URI`` is set (for example
``mongodb://localhost:27017/?replicaSet=rs0``, what ``docker compose -f docker/compose.yml up
-d mongo`` or ``bash .ci/mongodb replica-set`` starts); otherwise its variants are deselected
and the run says so in one line. The set-up is done here, so a CI job only starts the server:

- each run gets a database of its own (``mscheduler_it_<random>``), dropped at the end, so
  runs on one server (the Python versions of a CI matrix, a developer's shell) never meet;
- each test gets collections of its own in it, dropped after the test (`open_scheduler`);
  opening a scheduler creates the indexes (``Scheduler.connect`` ensures them), as in
  production;
- on a sharded cluster (the URI names a ``mongos``) each test's tasks collection is sharded
  on ``{key: 1}``, the shard key `docs/scaling.md` states, before its first use;
- a server that is neither a replica set nor a mongos, or that refuses change streams, fails
  the run at once, naming what is missing, rather than each transaction and change stream
  test one by one (or consumers quietly polling instead).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pymongo
import pytest

from mscheduler import layout

URI_VARIABLE = "MSCHEDULER_TEST_MONGODB_URI"
SHARD_KEY = {"key": 1}  # the unique publish key: every task has one, publish targets it


def mongodb_uri() -> str | None:
    return os.environ.get(URI_VARIABLE) or None


class MongoRun:
    """One pytest session's use of the real server: its client, its database, sharding."""

    def __init__(self, uri: str) -> None:
        self.client: pymongo.MongoClient[dict[str, Any]] = pymongo.MongoClient(
            uri, serverSelectionTimeoutMS=10_000
        )
        try:
            hello = self.client.admin.command("hello")
        except pymongo.errors.PyMongoError as exc:
            self.client.close()
            pytest.exit(f"{URI_VARIABLE}: cannot reach MongoDB: {exc}", returncode=2)
        self.sharded = hello.get("msg") == "isdbgrid"
        if "setName" not in hello and not self.sharded:
            self.client.close()
            pytest.exit(
                f"{URI_VARIABLE}: the server is a standalone mongod; the mongodb engine needs "
                "a replica set (start mongod with --replSet and run rs.initiate()) or a mongos, "
                "for transactions and change streams",
                returncode=2,
            )
        try:  # change streams on: the consumers must not quietly fall back to polling here
            with self.client["mscheduler_probe"]["probe"].watch(max_await_time_ms=1) as stream:
                stream.try_next()
        except pymongo.errors.OperationFailure as exc:
            self.client.close()
            pytest.exit(f"{URI_VARIABLE}: the server refuses change streams: {exc}", returncode=2)
        self.database = f"mscheduler_it_{uuid.uuid4().hex[:12]}"  # this run's, dropped at close

    def prepare(self, database: str, collection: str) -> None:
        """Before a test's collection is first opened: on a cluster, shard it on the key."""
        if not self.sharded:
            return  # created with its indexes by the first Scheduler.connect
        # The declared unique index on the shard key first, under its declared name: the
        # shard key then uses it (sharding would otherwise make its own ``key_1``, and the
        # declared one would then conflict with it).
        name, keys, options = next(
            index for index in layout.TASK_INDEXES if index[1] == (("key", 1),)
        )
        self.client[database][collection].create_index(list(keys), name=name, **options)
        self.client.admin.command(
            "shardCollection", f"{database}.{collection}", key=SHARD_KEY, unique=True
        )

    def close(self) -> None:
        self.client.drop_database(self.database)
        self.client.close()
