"""The memory backend keeps a document in a key-sharing dict (`compact`): it is the same
document to every reader and writer, a plain dict of the same items in the same order."""

from __future__ import annotations

import copy
import datetime as dt
import pickle
from typing import Any

import pytest
from bson import ObjectId

from mscheduler.backends.memory.compact import compact


def _task(n: int) -> dict[str, Any]:
    return {
        "_id": ObjectId(),
        "key": f"k{n}",
        "name": "job",
        "payload": {"n": n},
        "options": {"priority": n, "specific_worker_ids": [], "expires_at": None},
        "created_at": dt.datetime(2026, 1, 1),
        "worker_states": [],
    }


def test_a_compact_document_is_the_same_plain_dict():
    original = _task(1)
    stored = compact(copy.deepcopy(original))
    assert type(stored) is dict and type(stored["options"]) is dict
    assert stored == original and list(stored) == list(original)
    assert list(stored["options"].items()) == list(original["options"].items())
    assert copy.deepcopy(stored) == original and pickle.loads(pickle.dumps(stored)) == original
    assert compact(_task(2)) != stored and compact(_task(2))["key"] == "k2"


def test_every_write_to_a_compact_document_reads_back_as_written():
    stored = compact(_task(1))
    sibling = compact(_task(2))
    stored["key"] = "changed"
    stored["options"]["priority"] = 9
    stored["worker_states"].append({"run_id": "r"})
    stored["late"] = 1  # a field the shape did not have
    del stored["payload"]
    assert list(stored) == ["_id", "key", "name", "options", "created_at", "worker_states", "late"]
    assert stored["key"] == "changed" and stored["late"] == 1 and "payload" not in stored
    assert stored["options"]["priority"] == 9 and stored["worker_states"] == [{"run_id": "r"}]
    assert sibling == {**_task(2), "_id": sibling["_id"]}  # its sibling is untouched
    replaced = {**stored, "key": "again"}
    stored.clear()
    stored.update(replaced)
    assert stored == replaced and list(stored) == list(replaced)


@pytest.mark.parametrize(
    "document",
    [{"__class__": 1, "a": 2}, {1: "a number as a field"}, {}, {f"f{n}": n for n in range(40)}],
)
def test_a_document_whose_fields_cannot_be_attributes_is_kept_as_it_is(document: dict[Any, Any]):
    assert compact(document) is document
