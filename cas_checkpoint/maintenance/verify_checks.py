"""The small checks ``verify``'s audit makes of one thing at a time (a ref key's thread, a pack's
kind, a node's cost, two log entries)."""

from __future__ import annotations

from typing import Any

import msgpack

from cas_checkpoint.backends import Backend
from cas_checkpoint.backends.sealed import SealedBackend
from cas_checkpoint.engine.refs import is_hashed_key, thread_from_key, thread_key
from cas_checkpoint.engine.steps import ReadRef, ReadRefs, Step
from cas_checkpoint.errors import CasError, FormatError
from cas_checkpoint.format.objects import LogEntry, decode_node

ID_COST = 32  # what a load charges per child id (join.ID_COST)
KINDS = {b"N": "node", b"C": "record", b"L": "segment"}


def read_each(keys: list[str]) -> Step[list[tuple[bytes, str] | CasError | None]]:
    """Refs read in parallel: ``(bytes, version)``, None (gone) or the error reading it raised
    (then each is read on its own, to tell which failed)."""
    if not keys:
        return []
    try:
        both: list[tuple[bytes, str] | None] = yield ReadRefs(keys)
        return list(both)
    except CasError:
        out: list[tuple[bytes, str] | CasError | None] = []
        for key in keys:
            try:
                out.append((yield ReadRef(key)))
            except CasError as exc:
                out.append(exc)
        return out


def node(data: Any) -> tuple[tuple[str, ...], int]:
    """(children, bytes a load charges for the node)."""
    children, payload = decode_node(data)
    if not payload:
        raise FormatError("the state node has no shape byte")
    return children, len(payload) + ID_COST * len(children)


def what(data: memoryview) -> str:
    return KINDS.get(bytes(data[3:4]), "object") if bytes(data[:3]) == b"CAS" else "object"


def is_key(key: str) -> bool:
    """A thread key right under refs/heads, spelled as ``thread_key`` spells it."""
    if key.count("/") != 2:
        return False
    if is_hashed_key(key):
        return all(c in "0123456789abcdef" for c in key[-64:])
    thread = thread_from_key(key)
    return thread is not None and belongs(thread, key)


def belongs(thread: str, key: str, backend: Backend | None = None) -> bool:
    try:
        plain = thread_key(thread)
        return plain == key or (isinstance(backend, SealedBackend)
                                and backend.ref_key(plain) == key)
    except CasError:
        return False


def key_thread(key: str) -> tuple[str, ...]:
    thread = None if is_hashed_key(key) else thread_from_key(key)
    return () if thread is None else (thread,)


def same(a: LogEntry, b: LogEntry) -> bool:
    """Equal as stored (so a NaN in metadata equals itself)."""
    return a == b or bool(msgpack.packb(a.pack()) == msgpack.packb(b.pack()))


def diff(a: LogEntry, b: LogEntry) -> str:
    names = ("parents", "step", "created_at", "size", "label", "tags", "metadata", "status",
             "kind", "reason")
    return ", ".join(n for n in names if getattr(a, n) != getattr(b, n)) or "its fields"


