"""What the store's API takes and returns: checkpoint infos, loaded checkpoints, statistics,
and the checks of its arguments. Shared by the sync and async faces."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from itertools import repeat
from typing import Any, Final

import msgpack

from cas_checkpoint.errors import InvalidArgumentError, SerializationError
from cas_checkpoint.format.objects import (
    KINDS,
    MAX_LABEL,
    MAX_META_BYTES,
    MAX_META_DEPTH,
    MAX_REASON,
    MAX_TAG,
    MAX_TAGS,
    STATUSES,
    CheckpointId,
    LogEntry,
    Record,
    bad_text,
    is_object_id,
    unpack_meta,
)


class Unset(Enum):
    """The type of ``UNSET``: an argument not given, where ``None`` means something else
    (``expected_head=None``: the thread must not exist; ``keep_last=None``: keep all)."""

    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = Unset.UNSET


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


def check_text(value: object, what: str, most: int) -> str:
    """A str argument a save records (label, tag, reason): a str of at most ``most``
    characters, valid Unicode (a lone surrogate cannot be written as UTF-8)."""
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{what} must be a str, not {type(value).__name__}")
    if len(value) > most:
        raise InvalidArgumentError(
            f"{what} is {len(value)} characters long; it may be at most {most} (it is copied "
            "into the thread's log and head): shorten it, and put long text in the state")
    problem = bad_text(value)
    if problem is not None:
        raise InvalidArgumentError(f"{what} {problem}; pass a str without lone surrogates "
                                   "(e.g. text.encode('utf-8', 'replace').decode())")
    return value


def check_meta(label: object, tags: object, metadata: object) -> tuple[str | None, tuple[str, ...],
                                                                        dict[str, Any]]:
    """label=, tags= and metadata= of a save, checked by what every reader enforces (the
    decoder's own bounds and msgpack options), so no save records what a reader refuses."""
    if label is not None:
        label = check_text(label, "label", MAX_LABEL)
    if isinstance(tags, str) or not isinstance(tags, Iterable):
        raise InvalidArgumentError("tags must be a list of strings, e.g. tags=['tool']")
    tags = tuple(tags)
    if len(tags) > MAX_TAGS:
        raise InvalidArgumentError(f"tags has {len(tags)} tags, more than {MAX_TAGS}: they are "
                                   "copied into the thread's log and head; keep a few short "
                                   "tags and put the rest in the state or metadata")
    if tags:
        tags = tuple(check_text(tag, f"tags[{i}]", MAX_TAG) for i, tag in enumerate(tags))
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(map(isinstance, metadata, repeat(str))):
        raise InvalidArgumentError("metadata must be a dict with str keys")
    try:
        packed = msgpack.packb(metadata, strict_types=True)
        # the reader's own decoding of these bytes: what it refuses is refused here, unwritten
        copy = unpack_meta(packed)
    except Exception as exc:  # msgpack raises many types
        found: tuple[str, str] | None = _meta_problem(metadata) or ("metadata", str(exc))
    else:  # what msgpack accepts, but nested too deep (the reader's copy holds valid
        # UTF-8 str, str or bytes keys, 64-bit ints: only its depth is left to check)
        found = _meta_problem(copy) if _deeper(copy, MAX_META_DEPTH - 2) else None
    if found is not None:
        path, problem = found
        shown = path if len(path) <= 200 else f"{path[:100]}...{path[-80:]}"
        raise SerializationError(
            f"{shown} {problem}; metadata must hold JSON-like values (str, int, float, bool, "
            "None, list, and dict with str keys, at every depth): convert it, or put richer "
            "values in the state instead", path) from None
    _check_meta_size(len(packed))
    # a copy (as readers decode it): the caller may change its dict after the save returns
    return label, tags, copy


def _check_meta_size(size: int) -> None:
    if size > MAX_META_BYTES:
        raise InvalidArgumentError(
            f"metadata is {size} bytes encoded, more than {MAX_META_BYTES}; it is copied "
            "into the thread's log, so keep it small and put large values in the state"
        )


def add_meta(checked: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``checked`` (``check_meta``'s answer) with the keys of ``extra`` added: ``extra`` is
    checked alone and the whole one's size again, so what was checked is not walked twice (a
    LangGraph save's own metadata, under the keys its commit adds)."""
    got = check_meta(None, (), extra)[2]
    out = {**checked, **got}
    _check_meta_size(len(msgpack.packb(out, strict_types=True)))
    return out


def _deeper(value: dict[str, Any], most: int) -> bool:
    """Whether maps and lists nest in ``value`` more than ``most`` levels below it (a
    decoded copy: iterative, and it holds no cycle)."""
    todo: list[tuple[Any, int]] = [(value, 0)]
    while todo:
        value, depth = todo.pop()
        for item in (value.values() if type(value) is dict else value):
            if type(item) is dict or type(item) is list:
                if depth >= most:
                    return True
                todo.append((item, depth + 1))
    return False


def _meta_problem(metadata: dict[str, Any]) -> tuple[str, str] | None:
    """Where in ``metadata`` (a path such as ``metadata["scores"]``) a value that cannot be
    recorded is, and what is wrong with it; None if no such value is found. Iterative: any
    depth, and a dict that holds itself."""
    todo: list[tuple[str, object, int]] = [("metadata", metadata, 0)]
    while todo:
        path, value, depth = todo.pop()
        if depth >= MAX_META_DEPTH:  # (also ends the walk of a dict or list that holds itself)
            return path, f"nests more than {MAX_META_DEPTH} levels deep (or holds itself)"
        if type(value) is dict:
            for key, item in value.items():
                if type(key) not in (str, bytes):  # (the reader accepts bytes keys inside)
                    return path, (f"has a key {key!r} of type {type(key).__name__}: keys must "
                                  "be str (e.g. str(key))")
                problem = bad_text(key) if type(key) is str else None
                if problem is not None:
                    return path, f"has a key that {problem}"
                todo.append((f"{path}[{key!r}]", item, depth + 1))
        elif type(value) is list:
            todo.extend((f"{path}[{i}]", item, depth + 1) for i, item in enumerate(value))
        elif type(value) is str:
            problem = bad_text(value)
            if problem is not None:
                return path, problem
        elif type(value) is int:
            if not -(1 << 63) <= value < 1 << 64:
                return path, "is an int out of msgpack's 64-bit range"
        elif not (value is None or type(value) in (bool, float, bytes)):
            return path, f"is a {type(value).__name__}"
    return None


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
        reason = check_text(reason, "reason", MAX_REASON)
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
    packs: int = 0  # packs it names: its head's, and a long thread's archive and archived packs


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
