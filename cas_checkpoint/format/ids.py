"""Object names: the BLAKE3 hash (64 lowercase hex digits) of an object's bytes. Pure code."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NewType, cast

import blake3

ObjectId = NewType("ObjectId", str)
"""64 lowercase hex digits: the BLAKE3 hash of an object's bytes."""
CheckpointId = NewType("CheckpointId", str)
"""The ObjectId of a checkpoint record."""

_ID_RE = re.compile(r"^[0-9a-f]{64}$")
BIG_HASH = 1 << 20  # bytes from which BLAKE3 runs on several threads (a pack, say)


def object_id(data: bytes | memoryview) -> ObjectId:
    """The BLAKE3 name of ``data`` (a big one hashed on every core: the same hash)."""
    if len(data) >= BIG_HASH:
        return ObjectId(blake3.blake3(data, max_threads=blake3.blake3.AUTO).hexdigest())
    # Hashers are reused (making one costs more than hashing a 400-byte node): each call takes
    # one out of the pool while it works, so a call from another thread, or one nested in this
    # one (a signal handler, a finalizer), never shares it; one that raises is not put back.
    hasher = _HASHERS.pop() if _HASHERS else blake3.blake3()
    hasher.update(data)
    oid: ObjectId = hasher.digest().hex()  # type: ignore[assignment]
    hasher.reset()
    _HASHERS.append(hasher)
    return oid


_HASHERS: list[blake3.blake3] = []  # idle hashers, each reset (list pop/append are atomic)


def object_ids(datas: Sequence[bytes | memoryview]) -> list[ObjectId]:
    """``object_id`` of each of ``datas``, in one pass over a reused hasher (a load's nodes)."""
    if not datas or max(map(len, datas)) >= BIG_HASH:
        return [object_id(d) for d in datas]
    hasher = _HASHERS.pop() if _HASHERS else blake3.blake3()
    update, digest, reset = hasher.update, hasher.hexdigest, hasher.reset
    out = [(update(d), digest(), reset())[1] for d in datas]
    _HASHERS.append(hasher)
    return cast(list[ObjectId], out)


_SEEN: dict[int, tuple[bytes, ObjectId]] = {}  # id(bytes object) -> (it, its name)
SEEN_MAX = 1024  # bytes objects remembered (a head's inline objects: at most a few KB each)


def inline_id(data: bytes) -> ObjectId:
    """``object_id`` of a head's inline object, remembered for the very same bytes object (it
    is kept alive with its name, so its identity cannot be reused; bytes never change): a
    thread's inline objects are carried from head to head and need hashing once."""
    got = _SEEN.get(id(data))
    if got is not None and got[0] is data:
        return got[1]
    oid = object_id(data)
    if type(data) is bytes and len(data) <= 64 * 1024:
        if len(_SEEN) >= SEEN_MAX:
            _SEEN.clear()
        _SEEN[id(data)] = (data, oid)
    return oid


def inline_ids(datas: Sequence[bytes]) -> list[ObjectId]:
    """``inline_id`` of each of ``datas``: those not remembered hashed in one pass
    (``object_ids``: a head read for the first time names a few dozen small objects), then
    remembered."""
    got = [_SEEN.get(id(d)) for d in datas]
    out = [None if g is None or g[0] is not d else g[1] for g, d in zip(got, datas, strict=True)]
    todo = [i for i, oid in enumerate(out) if oid is None]
    if todo:
        for i, oid in zip(todo, object_ids([datas[i] for i in todo]), strict=True):
            out[i] = oid
            data = datas[i]
            if type(data) is bytes and len(data) <= 64 * 1024:
                if len(_SEEN) >= SEEN_MAX:
                    _SEEN.clear()
                _SEEN[id(data)] = (data, oid)
    return cast(list[ObjectId], out)


def hashed(data: bytes, oid: ObjectId) -> None:
    """Tell ``inline_id`` that ``data`` hashes to ``oid``: the caller has just hashed these
    very bytes (a save's root node, which its record checks)."""
    if type(data) is bytes and len(data) <= 64 * 1024:
        if len(_SEEN) >= SEEN_MAX:
            _SEEN.clear()
        _SEEN[id(data)] = (data, oid)


def is_object_id(text: object) -> bool:
    return isinstance(text, str) and _ID_RE.match(text) is not None
