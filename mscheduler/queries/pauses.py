"""Paused names (``<collection>.paused``, `store.pauses`): one document per name, keyed by
it; filters, pure."""

from __future__ import annotations

from collections.abc import Sequence

from .stages import Document


def by_name(name: str) -> Document:
    return {"_id": name}


def of_names(names: Sequence[str] | None) -> Document:
    """The paused names among ``names`` (None: every paused name)."""
    return {} if names is None else {"_id": {"$in": list(names)}}
