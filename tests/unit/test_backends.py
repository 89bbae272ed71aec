"""Connecting: URIs, unreachable servers, and the collections a Scheduler accepts."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pymongo import AsyncMongoClient, MongoClient

import mscheduler as ms
from mscheduler.backends.counting import CountingCollection
from mscheduler.backends.memory import MemoryServer, memory_server
from mscheduler.backends.uri import redact
from mscheduler.errors import BackendUnavailable, ConfigurationError
from mscheduler.store.transactions import supports_transactions
from mscheduler.testing import ManualClock
from tests.faults import FaultyCollection

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("localhost:27017", "is not a URI"),
        ("redis://localhost", "unsupported scheme 'redis'"),
        ("mongodb://", "is not a valid MongoDB URI"),
        ("mongodb://h:notaport", "is not a valid MongoDB URI"),
        ("mongodb://u:secret@h:1/?tls=maybe", "option tls='maybe' is not valid"),
        ("mongodb://u:secret@h:1/?wtimeoutMS=soon", "option wtimeoutMS='soon' is not valid"),
        ("mongodb://h/?replicaSett=rs0", "'replicaSett' is not a MongoDB URI option"),
        ("mongodb://h/?tlsCertificateKeyFilePassword=x&bogus=1", "'bogus' is not a MongoDB"),
        ("memory://x/path", "a memory URI is memory://"),
        ("memory://x?colour=red", "unknown memory:// option"),
    ],
)
async def test_malformed_uris_are_refused(uri: str, message: str):
    with pytest.raises(ConfigurationError, match=message) as info:
        await ms.Scheduler.connect(uri)
    assert "secret" not in str(info.value)


async def test_a_misspelt_uri_option_is_named_with_the_option_it_resembles():
    with pytest.raises(ConfigurationError) as info:
        await ms.Scheduler.connect("mongodb://h/?replicaSett=rs0")
    assert str(info.value) == (
        "uri: 'replicaSett' is not a MongoDB URI option; did you mean 'replicaset'? "
        "(names ignore case)"
    )


async def test_unreachable_server_fails_within_the_timeout():
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="cannot reach MongoDB"):
        await ms.Scheduler.connect("mongodb://127.0.0.1:1/", server_selection_timeout_ms=300)
    assert time.monotonic() - started < 5


def test_password_is_redacted():
    assert redact("mongodb://app:s3cret@db:27017/x") == "mongodb://app:***@db:27017/x"


def test_a_sync_collection_is_refused():
    client: MongoClient[dict[str, object]] = MongoClient("mongodb://127.0.0.1:1", connect=False)
    with pytest.raises(ConfigurationError, match="synchronous pymongo Collection"):
        ms.Scheduler(client["db"]["tasks"])


def test_something_else_is_refused():
    with pytest.raises(ConfigurationError, match="expected an async MongoDB collection"):
        ms.Scheduler({"not": "a collection"})


async def test_a_motor_style_collection_works(clock: ManualClock):
    # mongomock-motor's collection stands in for Motor's, on the memory server's own engine:
    # stock mongomock lacks operators the store's updates use ($unset, $add of a date).
    server = MemoryServer()
    server.collection("db", "tasks")
    collection = server.client["db"]["tasks"]
    sched = ms.Scheduler(collection, clock=clock)
    assert (await sched.publish("k", 1, name="job")).created
    lease = await sched.store.tasks.claim("w1", names=["job"])
    assert lease is not None
    assert (await sched.store.tasks.succeed(lease, 2)).state is ms.TaskState.SUCCESS
    info = await collection.index_information()
    assert info["key_unique"]["unique"], "indexes are ensured before the first write"


async def test_invalid_collection_name():
    with pytest.raises(ConfigurationError, match="collection"):
        await ms.Scheduler.connect("memory://", collection="bad$name")


def test_transactions_are_decided_from_the_collection_type():
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(connect=False)
    real = client["db"]["tasks"]
    memory = memory_server("").collection("db", "tasks")
    assert supports_transactions(real)  # no bool() of the sub-collection real.supports_...
    assert not supports_transactions(memory)
    assert supports_transactions(CountingCollection(real))
    assert not supports_transactions(FaultyCollection(memory, rate=0))
