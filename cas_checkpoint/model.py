"""What the store's API takes and returns: checkpoint infos, loaded checkpoints, statistics,
and the checks of its arguments. Shared by the sync and async faces."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgpack

from .errors import InvalidArgumentError, SerializationError
from .objects import (
    KINDS,
    MAX_META_BYTES,
    MAX_REASON,
    STATUSES,
    CheckpointId,
    LogEntry,
    Record,
    is_object_id,
)


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
    status: str | None = None  # in_progress, completed, failed, halted (None: not set)
    kind: str | None = None  # automatic, manual, pre_operation, recovery (None: not set)
    reason: str | None = None  # why a checkpoint is failed or halted


@dataclass(frozen=True, slots=True)
class Checkpoint(CheckpointInfo):
    """A loaded checkpoint: its info and its state."""

    state: Any = None


def info_of(entry: LogEntry, thread_id: str) -> CheckpointInfo:
    return CheckpointInfo(entry.id, thread_id, entry.step, entry.parents,
                          datetime.fromtimestamp(entry.created_at, UTC), entry.size,
                          entry.label, entry.tags, entry.metadata, entry.status, entry.kind,
                          entry.reason)


def checkpoint_of(cid: CheckpointId, thread_id: str | None, record: Record,
                  state: Any) -> Checkpoint:
    return Checkpoint(cid, thread_id or record.thread_id, record.step, record.parents,
                      datetime.fromtimestamp(record.created_at, UTC), record.size,
                      record.label, record.tags, record.metadata, record.status,
                      record.kind, record.reason, state)


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
    # a copy (the packed form's): the caller may change its dict after the save returns
    return label, tags, msgpack.unpackb(packed, strict_map_key=False)


def check_annotations(status: object, kind: object, reason: object
                      ) -> tuple[str | None, str | None, str | None]:
    """A checkpoint's status, kind and reason as given to save(), checked."""
    if status is not None and status not in STATUSES:
        raise InvalidArgumentError(f"status must be one of {', '.join(map(repr, STATUSES))} "
                                   f"or None, not {status!r}")
    if kind is not None and kind not in KINDS:
        raise InvalidArgumentError(f"kind must be one of {', '.join(map(repr, KINDS))} or "
                                   f"None, not {kind!r}")
    if reason is not None:
        if status not in ("failed", "halted"):
            raise InvalidArgumentError("reason= says why a checkpoint failed or halted: pass "
                                       "it with status='failed' or status='halted'")
        if not isinstance(reason, str) or len(reason) > MAX_REASON:
            raise InvalidArgumentError(f"reason must be a str of at most {MAX_REASON} "
                                       "characters (put details in the state or metadata)")
    return status, kind, reason


def entry_filter(kind: object, status: object) -> Callable[[LogEntry], bool]:
    """The test of find/history's ``kind=`` and ``status=`` (each one value, a list of them,
    or None for any), checked now."""
    kinds, statuses = check_filter(kind, KINDS, "kind"), check_filter(status, STATUSES, "status")
    return lambda e: ((kinds is None or e.kind in kinds)
                      and (statuses is None or e.status in statuses))


def check_filter(value: object, allowed: tuple[str, ...], what: str) -> frozenset[str] | None:
    """A status= or kind= filter of find/history: one value or several, each allowed."""
    if value is None:
        return None
    values = (value,) if isinstance(value, str) else (
        tuple(value) if isinstance(value, list | tuple | set | frozenset) else None)
    if values is None or not all(v in allowed for v in values):
        raise InvalidArgumentError(f"{what} must be one of {', '.join(map(repr, allowed))}, "
                                   f"or a list of them, not {value!r}")
    out = frozenset(values)
    if not out:
        raise InvalidArgumentError(f"{what}= is an empty list: it would match nothing; pass "
                                   "None to match every checkpoint")
    return out


@dataclass(frozen=True, slots=True)
class ThreadStats:
    """One thread's figures in ``stats(by_thread=True)``."""

    checkpoints: int  # in its log
    messages: int | None  # len of its head state's "messages" list (None: no such list)
    logical_bytes: int  # sum of its checkpoints' encoded state sizes
    physical_bytes: int  # its ref plus the packs it names (a shared pack counts in each thread)
    dedup_ratio: float  # logical / physical


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
    by_thread: dict[str, ThreadStats] = field(default_factory=dict)  # stats(by_thread=True)
