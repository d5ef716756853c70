"""Immutable objects by id, over a Backend. Every read re-hashes: wrong bytes are never returned."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable

from .backend import Backend
from .errors import IntegrityError, NotFoundError
from .objects import ObjectId, object_id

PREFIX = "objects"


def object_key(oid: str) -> str:
    """``objects/ab/cdef...``: 256 folders, so no folder grows huge."""
    return f"{PREFIX}/{oid[:2]}/{oid[2:]}"


def key_object_id(key: str) -> ObjectId | None:
    """The id named by an object key, or None for a key that is not an object."""
    parts = key.split("/")
    if len(parts) != 3 or parts[0] != PREFIX or len(parts[1]) != 2:
        return None
    oid = parts[1] + parts[2]
    if len(oid) != 64 or any(c not in "0123456789abcdef" for c in oid):
        return None
    return ObjectId(oid)


class ObjectStore:
    """Content-addressed reads and writes, with a small verified read cache."""

    def __init__(self, backend: Backend, cache_bytes: int = 32 * 1024 * 1024) -> None:
        self.backend = backend
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._cache_bytes = 0
        self._cache_limit = cache_bytes
        self._lock = threading.Lock()

    def _remember(self, oid: str, data: bytes) -> None:
        if len(data) > self._cache_limit // 8:
            return
        with self._lock:
            if oid in self._cache:
                self._cache.move_to_end(oid)
                return
            self._cache[oid] = data
            self._cache_bytes += len(data)
            while self._cache_bytes > self._cache_limit:
                _, old = self._cache.popitem(last=False)
                self._cache_bytes -= len(old)

    def _cached(self, oid: str) -> bytes | None:
        with self._lock:
            data = self._cache.get(oid)
            if data is not None:
                self._cache.move_to_end(oid)
            return data

    def forget(self, oids: Iterable[str]) -> None:
        with self._lock:
            for oid in oids:
                data = self._cache.pop(oid, None)
                if data is not None:
                    self._cache_bytes -= len(data)

    def _check(self, oid: str, data: bytes) -> bytes:
        actual = object_id(data)
        if actual != oid:
            raise IntegrityError(oid, actual, object_key(oid))
        return data

    def put_many(self, objects: dict[ObjectId, bytes]) -> None:
        """Write objects that are not there yet (each completely or not at all)."""
        if objects:
            self.backend.put_many({object_key(k): v for k, v in objects.items()})
            for oid, data in objects.items():
                self._remember(oid, data)

    def get(self, oid: str) -> bytes:
        return self.get_many([oid])[oid]

    def get_many(self, oids: Iterable[str]) -> dict[str, bytes]:
        """Read and verify objects concurrently; NotFoundError names the first missing one."""
        out: dict[str, bytes] = {}
        missing = []
        for oid in dict.fromkeys(oids):
            data = self._cached(oid)
            if data is None:
                missing.append(oid)
            else:
                out[oid] = data
        if missing:
            got = self.backend.get_many(object_key(o) for o in missing)
            for oid in missing:
                data = got[object_key(oid)]
                if data is None:
                    raise NotFoundError(
                        f"object {object_key(oid)} is missing from {self.backend.url}; a "
                        "checkpoint that needs it cannot be loaded. Run `cas-checkpoint verify` "
                        "to list the checkpoints affected."
                    )
                out[oid] = self._check(oid, data)
                self._remember(oid, data)
        return out
