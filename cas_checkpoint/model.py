"""What the store's API takes and returns: checkpoint infos, loaded checkpoints, statistics,
and the checks of its arguments. Shared by the sync and async faces."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgpack

from .errors import InvalidArgumentError, SerializationError
from .objects import MAX_META_BYTES, CheckpointId, LogEntry, is_object_id


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """What history/find return: everything about a checkpoint but its state."""

    id: CheckpointId
    thread_id: str
    step: int
    parent_ids: tuple[CheckpointId, ...]
    created_at: datetime
    size: int  # encoded state bytes
    label: str | None = None
    tags: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Checkpoint(CheckpointInfo):
    """A loaded checkpoint: its info and its state."""

    state: Any = None


def info_of(entry: LogEntry, thread_id: str) -> CheckpointInfo:
    return CheckpointInfo(entry.id, thread_id, entry.step, entry.parents,
                          datetime.fromtimestamp(entry.created_at, UTC), entry.size,
                          entry.label, entry.tags, entry.metadata)


def check_id(cid: object, what: str = "checkpoint id") -> CheckpointId:
    if not is_object_id(cid):
        raise InvalidArgumentError(
            f"{what} {cid!r} is not a checkpoint id (64 lowercase hex digits, as returned by "
            "save() or history())"
        )
    return CheckpointId(str(cid))


def check_meta(label: object, tags: object, metadata: object) -> tuple[str | None, tuple[str, ...],
                                                                        dict[str, Any]]:
    if label is not None and not isinstance(label, str):
        raise InvalidArgumentError(f"label must be a str or None, not {type(label).__name__}")
    if isinstance(tags, str) or not isinstance(tags, Iterable):
        raise InvalidArgumentError("tags must be a list of strings, e.g. tags=['tool']")
    tags = tuple(tags)
    if not all(isinstance(t, str) for t in tags):
        raise InvalidArgumentError("every tag must be a str")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) for k in metadata):
        raise InvalidArgumentError("metadata must be a dict with str keys")
    try:
        packed = msgpack.packb(metadata, strict_types=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SerializationError(
            f"metadata must hold JSON-like values (str, int, float, bool, None, list, dict): "
            f"{exc}; put richer values in the state instead", "metadata") from None
    if len(packed) > MAX_META_BYTES:
        raise InvalidArgumentError(
            f"metadata is {len(packed)} bytes encoded, more than {MAX_META_BYTES}; it is copied "
            "into the thread's log, so keep it small and put large values in the state"
        )
    return label, tags, metadata


@dataclass(frozen=True, slots=True)
class StoreStats:
    """What ``stats()`` reports."""

    threads: int
    checkpoints: int  # distinct checkpoints over all threads
    logical_bytes: int  # sum of their encoded state sizes
    physical_bytes: int  # bytes stored: packs and refs
    objects: int  # packs stored (each holds many objects)
    dedup_ratio: float  # logical / physical
    cache_hits: int = 0  # packs this store object found in its caches (memory, cache_dir)
    cache_misses: int = 0  # packs it had to read from storage
