"""Every collection the store may be handed satisfies `TasksCollection`: mypy checks this
module (``mypy mscheduler tests/static``; `tests/unit/test_collection_protocol.py` runs it),
so an engine that lacks a method the store calls, or takes it another way, fails here."""

from __future__ import annotations

from typing import Any

from motor.motor_asyncio import AsyncIOMotorCollection
from pymongo.asynchronous.collection import AsyncCollection

from mscheduler.backends.counting import CountingCollection
from mscheduler.backends.memory.server import MemoryCollection
from mscheduler.backends.sync import AwaitableCollection
from mscheduler.collection import TasksCollection, TasksDatabase
from mscheduler.store.transactions import SessionCollection


def pymongo_async(collection: AsyncCollection[dict[str, Any]]) -> TasksCollection:
    return collection


def pymongo_async_any(collection: AsyncCollection[Any]) -> TasksCollection:
    return collection


def motor(collection: AsyncIOMotorCollection[dict[str, Any]]) -> TasksCollection:
    return collection


def memory(collection: MemoryCollection) -> TasksCollection:
    return collection


def synchronous(collection: AwaitableCollection) -> TasksCollection:
    return collection


def in_a_session(collection: SessionCollection) -> TasksCollection:
    return collection


def counted(collection: CountingCollection) -> TasksCollection:
    return collection


def databases(
    pymongo: AsyncCollection[dict[str, Any]],
    motor: AsyncIOMotorCollection[dict[str, Any]],
    memory: MemoryCollection,
    synchronous: AwaitableCollection,
) -> list[TasksDatabase]:
    return [pymongo.database, motor.database, memory.database, synchronous.database]
