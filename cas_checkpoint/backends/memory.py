"""fsspec's ``memory://`` filesystem: shared by every store in this process, gone at exit."""

from __future__ import annotations

import builtins
import itertools
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from cas_checkpoint.backends.base import Backend, ObjectInfo, RefMismatch, T, _version
from cas_checkpoint.errors import NotFoundError

VERSIONS_KEPT = 1024  # refs whose version is remembered (under the class-wide lock)
VERSION_BYTES = 64 * 1024  # a bigger ref is hashed each time


class MemoryBackend(Backend):
    """fsspec's ``memory://`` filesystem: shared by every store in this process, gone at exit.

    A file's bytes are read with ``getvalue()``: a ``MemoryFile`` (a ``BytesIO``) made of a
    bytes object hands out that very object, not a copy, until it is changed in place (then
    a copy of what it holds now); so a ref's bytes, compared with the version remembered for
    them, are mostly the same object, and a pack is not copied on each read."""

    exact_mtimes = atomic_delete = True
    _lock = threading.Lock()
    # the version of each ref as last written or read, with its bytes (a ref is compared with
    # them, a memcmp, instead of being hashed again: a save reads its ref's version, then writes)
    _versions: dict[str, tuple[bytes, str]] = {}
    # A ref written here (of at most VERSION_BYTES) is versioned by a write counter, not
    # hashed: ``w<n>`` stands for these bytes while they are remembered, and no other bytes
    # ever get it. Forgotten (more than VERSIONS_KEPT refs), the same bytes read as their
    # hash: a writer that held ``w<n>`` loses one compare-and-swap and reads the ref again.
    _writes = itertools.count()

    def __init__(self, fs: Any, root: str) -> None:
        from fsspec.implementations.memory import MemoryFile  # (fsspec only for memory://)

        self._file = MemoryFile
        self.fs = fs
        self.root = "/" + root.strip("/")
        self.url = "memory://" + self.root
        self._prefix = self.root.rstrip("/") + "/"  # "/" for the whole memory:// filesystem
        self.shared_scope = (fs, self.root)

    def _path(self, key: str) -> str:
        return self._prefix + key

    def get(self, key: str) -> bytes:
        try:
            return bytes(self.fs.cat_file(self._path(key)))
        except FileNotFoundError:
            raise NotFoundError(f"{key} does not exist in {self.url}") from None

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        """Reads from the process's memory: one after the other, no thread pool."""
        out: dict[str, bytes | None] = {}
        store = self.fs.store
        for key in keys:
            f = store.get(self._path(key))
            out[key] = None if f is None else f.getvalue()
        return out

    def put_many(self, items: dict[str, bytes]) -> None:
        with self._lock:
            for key, data in items.items():
                path = self._path(key)
                existing = self.fs.store.get(path)
                if existing is not None:  # a reused object is fresh again for the GC grace
                    existing.modified = datetime.now(UTC)
                else:
                    self.fs.pipe_file(path, bytes(data))

    def _version_of(self, path: str, data: bytes) -> str:
        """``_version(data)`` of the ref at ``path``: the one remembered when these very bytes
        (compared, not trusted by identity) were last written or read there, else hashed.
        Called under the lock."""
        got = self._versions.get(path)
        if got is not None and got[0] == data:
            return got[1]
        version = _version(data)
        self._remember_version(path, data, version)
        return version

    def _remember_version(self, path: str, data: bytes, version: str) -> None:
        if len(data) <= VERSION_BYTES:
            if len(self._versions) >= VERSIONS_KEPT and path not in self._versions:
                self._versions.clear()
            self._versions[path] = (data, version)

    def read_ref(self, key: str) -> tuple[bytes, str] | None:
        path = self._path(key)
        with self._lock:
            f = self.fs.store.get(path)
            if f is None:
                return None
            data = f.getvalue()
            return data, self._version_of(path, data)

    def write_ref(self, key: str, data: bytes, expected: str | None,
                  refresh: Callable[[], None] | None = None) -> str:
        path = self._path(key)
        with self._lock:
            f = self.fs.store.get(path)
            current = None if f is None else self._version_of(path, f.getvalue())
            if current != expected:
                raise RefMismatch(key)
            data = bytes(data)
            if f is not None and type(f) is self._file:
                # A file replaced by another at the same path (its folders exist): what
                # pipe_file ends with, without its checks of every parent folder.
                self._file(self.fs, path, data).commit()
            else:
                self.fs.pipe_file(path, data)
            if len(data) <= VERSION_BYTES:
                version = f"w{next(self._writes)}"
            else:
                version = _version(data)
            self._remember_version(path, data, version)
        return version

    def read_ref_unlocked(self, key: str) -> str | None:
        path = self._path(key)
        f = self.fs.store.get(path)
        return None if f is None else self._version_of(path, f.getvalue())

    def delete_ref(self, key: str, expected: str) -> None:
        with self._lock:
            if self.read_ref_unlocked(key) != expected:
                raise RefMismatch(key)
            self.fs.rm_file(self._path(key))

    def list(self, prefix: str) -> list[ObjectInfo]:
        base = self._path(prefix.rstrip("/"))
        with self._lock:
            try:
                found = self.fs.find(base, detail=True)
            except FileNotFoundError:
                return []
            out = []
            for path, info in found.items():
                f = self.fs.store.get(path)
                when = getattr(f, "modified", None) or info.get("created")
                mtime = when.timestamp() if isinstance(when, datetime) else time.time()
                out.append(ObjectInfo(path[len(self._prefix):], int(info.get("size") or 0),
                                      mtime))
        return out

    def read_refs(self, keys: builtins.list[str]) -> builtins.list[tuple[bytes, str] | None]:
        return [self.read_ref(k) for k in keys]

    def delete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        with self._lock:
            for key in keys:
                try:
                    self.fs.rm_file(self._path(key))
                except FileNotFoundError:
                    pass
        return []


    # The async face answers inline: the data is in this process's memory, so a thread (or a
    # thread pool) per call would only add cost.

    async def run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    async def aget_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        return self.get_many(keys)

    async def aput_many(self, items: dict[str, bytes]) -> None:
        self.put_many(items)

    async def aread_ref(self, key: str) -> tuple[bytes, str] | None:
        return self.read_ref(key)

    async def aread_refs(self, keys: builtins.list[str]) -> builtins.list[tuple[bytes, str] | None]:
        return self.read_refs(keys)

    async def awrite_ref(self, key: str, data: bytes, expected: str | None,
                         refresh: Callable[[], None] | None = None) -> str:
        return self.write_ref(key, data, expected, refresh)

    async def adelete_ref(self, key: str, expected: str) -> None:
        self.delete_ref(key, expected)

    async def alist(self, prefix: str) -> builtins.list[ObjectInfo]:
        return self.list(prefix)

    async def alist_many(self, prefixes: Iterable[str]) -> builtins.list[ObjectInfo]:
        return builtins.list(self.list_many(prefixes))

    async def adelete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        return self.delete_many(keys)

    def delete_unless_touched(self, infos: builtins.list[ObjectInfo],
                              cutoff: float) -> builtins.list[bool]:
        """Each of ``infos`` still older than ``cutoff`` deleted, under the lock that writers
        take to put or refresh an object."""
        out = []
        with self._lock:
            for info in infos:
                path = self._path(info.key)
                f = self.fs.store.get(path)
                if f is None or _mtime(f) >= cutoff:
                    out.append(False)
                    continue
                self.fs.rm_file(path)
                out.append(True)
        return out


def _mtime(f: Any) -> float:
    when = getattr(f, "modified", None) or getattr(f, "created", None)
    if isinstance(when, datetime):
        return when.timestamp()
    return datetime.now(UTC).timestamp()
