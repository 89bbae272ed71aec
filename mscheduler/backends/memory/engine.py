"""mongomock's query engine, the memory server's own copy: its ``filtering``, ``aggregate`` and
``collection`` modules loaded once more from the pinned mongomock's files, wired to each
other, and changed (`agreement`, `fast_paths`). mongomock's own modules are never touched, so
any other mongomock user in the process keeps mongomock as it is.

A copy and not a patch, because mongomock's functions find each other through their module's
globals (``_Parser``, ``_copy_field``, ``copy``, ``helpers``, the pipeline stages, the
``$expr`` evaluator that ``aggregate`` registers with ``filtering``): changing what a name
means for our collections alone needs a namespace of our own for those functions.
"""

from __future__ import annotations

import importlib.util
import types
from typing import Any

import mongomock.aggregate
import mongomock.collection
import mongomock.filtering
import mongomock.helpers

from . import agreement, fast_paths


def _own_copy(module: types.ModuleType) -> Any:
    """``module`` executed again from its file, as a module of its own (not in
    ``sys.modules``); its imports resolve in mongomock's package, as the original's do."""
    spec = importlib.util.spec_from_file_location(
        f"{__name__}.{module.__name__.rpartition('.')[2]}", module.__file__
    )
    assert spec is not None and spec.loader is not None
    copy = importlib.util.module_from_spec(spec)
    copy.__package__ = "mongomock"
    spec.loader.exec_module(copy)
    return copy


filtering = _own_copy(mongomock.filtering)
aggregate = _own_copy(mongomock.aggregate)
# Executing aggregate registered its `$expr` evaluator with mongomock's filtering: give that
# back, and give ours to our filtering.
mongomock.filtering.register_parse_expression(mongomock.aggregate._parse_expression)  # type: ignore[no-untyped-call]
filtering.register_parse_expression(aggregate._parse_expression)
collection = _own_copy(mongomock.collection)

# mongomock's helpers, with our conversion of dates for the two modules that call it.
helpers = types.ModuleType(f"{__name__}.helpers")
helpers.__dict__.update(mongomock.helpers.__dict__)
helpers.patch_datetime_awareness_in_document = fast_paths.documents_as_stored  # type: ignore[attr-defined]

aggregate.filtering = filtering
aggregate.helpers = helpers
collection.aggregate = aggregate
collection.filtering = filtering
collection.filter_applies = filtering.filter_applies
collection.helpers = helpers

agreement.apply(aggregate)
fast_paths.apply(aggregate, collection)

Collection: type = collection.Collection
filter_applies = filtering.filter_applies
