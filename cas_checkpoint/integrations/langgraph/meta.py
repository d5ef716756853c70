"""LangGraph's checkpoint metadata in the store's log.

The log holds JSON-like values only (``check_meta``: a reader refuses anything else), as
LangGraph's own contract for metadata says. LangGraph itself writes tuples into it
(``counters_since_delta_snapshot: dict[str, tuple[int, int]]``), so a tuple is stored as a list
(a JSON array, as SqliteSaver's JSON keeps it) and the fields ``CheckpointMetadata`` declares
as tuples come back as tuples. Anything else that is not JSON-like is still refused by the
store's check, on put, before anything is written.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping
from typing import Any, Union, get_args, get_origin, get_type_hints

from langgraph.checkpoint.base import CheckpointMetadata

MAX_DEPTH = 64  # tuples deeper than this are left for the store's check to refuse


@functools.cache
def _hints() -> dict[str, Any]:
    return get_type_hints(CheckpointMetadata)


def _lists(value: Any, depth: int = 0) -> Any:
    t = type(value)
    if depth >= MAX_DEPTH or t not in (tuple, list, dict):
        return value
    if t is dict:
        return {k: _lists(v, depth + 1) for k, v in value.items()}
    return [_lists(v, depth + 1) for v in value]


def _as(hint: Any, value: Any) -> Any:
    """``value`` (from the log) with the tuples ``hint`` declares rebuilt; anything that does
    not have the declared shape is returned as it is."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Union or origin is types.UnionType:
        for arg in args:
            got = _as(arg, value)
            if got is not value:
                return got
        return value
    if origin is tuple and type(value) is list:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_as(args[0], v) for v in value)
        if len(args) == len(value):
            return tuple(_as(a, v) for a, v in zip(args, value, strict=True))
        return tuple(value)
    if origin is dict and type(value) is dict and len(args) == 2:
        return {k: _as(args[1], v) for k, v in value.items()}
    if origin is list and type(value) is list and args:
        return [_as(args[0], v) for v in value]
    return value


def to_log(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """LangGraph's metadata as the log stores it: tuples as lists."""
    return {k: _lists(v) for k, v in metadata.items()}


def from_log(stored: Mapping[str, Any]) -> dict[str, Any]:
    """Metadata as LangGraph wrote it: the fields ``CheckpointMetadata`` declares as tuples
    (or holding tuples) are tuples again."""
    hints = _hints()
    return {k: _as(hints[k], v) if k in hints else v for k, v in stored.items()}
