"""The storage primitives every backend provides, sync and async.

Keys are ``/``-separated paths relative to the store's root. Two families of keys:

* immutable packs (``packs/ab/cdef...``): ``get``, ``get_many``, ``put_many`` (create if absent;
  an existing one is left as it is, since its content is the same by construction);
* mutable refs (``refs/...``): ``read_ref`` returns the bytes together with a version token and
  ``write_ref``/``delete_ref`` succeed only if the ref still has the expected version
  (compare-and-swap). A ``RefMismatch`` tells the caller to re-read and try again.

Each primitive has an awaitable twin (``aget_many``, ``awrite_ref``...) used by
``AsyncCheckpointStore``; the store's logic drives either through ``steps.py``.
"""

from __future__ import annotations

import bisect
import builtins
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Iterator
from concurrent.futures import Future as ConcurrentFuture
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import blake3

from cas_checkpoint.errors import NotFoundError
from cas_checkpoint.format import decoding

T = TypeVar("T")
_POOL_LOCK = threading.Lock()
_STACK_LOCK = threading.Lock()  # held while a pool starts threads (``_Pool``)
# The pools the async face of blocking backends (local disk) runs on, one a process per size,
# shared by every backend object: a new store object or saver per request (a web handler, the
# agent benchmark's "latest state, new saver") used to start a thread of its own (~0.1 ms
# before its first request) and keep up to ``async_threads`` of them until the collector freed
# it. Threads start as work needs them and stay idle for the next store object. One pool a
# device (``Backend.pool_key``): a stalled disk or mount holds the threads of its own stores
# only, not those of every local store of the process.
_POOLS: dict[tuple[int, Hashable], ThreadPoolExecutor] = {}


def _forget_pools() -> None:  # a forked child has none of its parent's threads
    global _POOL_LOCK, _STACK_LOCK
    _POOL_LOCK, _STACK_LOCK = threading.Lock(), threading.Lock()
    _POOLS.clear()


os.register_at_fork(after_in_child=_forget_pools)

POOL_STACK = 8 << 20  # the stack of a pool thread: Linux's usual default, set for every platform


class _Pool(ThreadPoolExecutor):
    """A ThreadPoolExecutor whose threads start with a stack of at least POOL_STACK bytes, and
    tell the decoder so (``decoding.stack_is``: ormsgpack decodes there, as on the main thread;
    the async face of local disk decodes on these threads).

    The stack size of new threads is the process's (``threading.stack_size``): it is set while
    this pool starts threads (they start in ``submit``), under a lock, and put back. A thread
    that sets it meanwhile without the lock would give a pool thread another size: if the size
    is not the pool's when it is put back, or cannot be set here, the pool's threads decode
    with msgpack alone, which needs no more than a small stack. Once all ``workers`` threads
    have started, a submit starts none: it leaves the process's setting alone (no lock, no
    window in which another thread's own ``threading.stack_size`` call is undone)."""

    def __init__(self, workers: int, prefix: str) -> None:
        super().__init__(workers, thread_name_prefix=prefix, initializer=self._started)
        self._stack = 0  # the size its threads started with; 0: unknown
        self._workers, self._begun = workers, 0  # threads it may start, threads started

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> ConcurrentFuture[T]:
        if self._begun >= self._workers:  # (every thread started: this submit starts none)
            return super().submit(fn, *args, **kwargs)
        with _STACK_LOCK:
            try:
                old = threading.stack_size()
                size = max(old, POOL_STACK)
                threading.stack_size(size)
            except (ValueError, RuntimeError):  # (a platform that cannot set it)
                self._stack, size = -1, 0
            try:
                return super().submit(fn, *args, **kwargs)
            finally:
                if size and threading.stack_size(old) != size:
                    self._stack = -1  # (changed meanwhile: no size is vouched for)
                elif size and self._stack >= 0:
                    self._stack = min(self._stack or size, size)

    def _started(self) -> None:
        """In each new thread: it learns its stack once its starter has put the size back."""
        with _STACK_LOCK:
            self._begun += 1
            if self._stack > 0:
                decoding.stack_is(self._stack)


class RefMismatch(Exception):
    """Internal: a compare-and-swap found another version than expected."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    mtime: float  # seconds since the epoch, by the storage's own clock
    regular: bool = True  # False: a folder, a link or a device where a file should be
    # What changes whenever the bytes do, as the listing gives it ("" where it gives none: the
    # key must be read to know). S3: the ETag; local disk: inode, size and the ns modified and
    # change times (``os.utime`` can set the modified time back, not the change time).
    version: str = ""


MAX_REF_BYTES = 4 << 20  # a ref larger than this is refused before it is read
LOCK_WAIT = 10.0  # seconds a local ref update waits for another writer's lock, at most
REFRESH_WAIT = 0.5  # a ref update that waited longer than this for its lock refreshes its packs


class DiskScope:
    """What the local folders of this process name their ``shared_scope`` by (the engine's
    process caches keep less for them than for memory://)."""


DISK = DiskScope()


class Backend(ABC):
    """Storage primitives. Every method is safe to call from several threads."""

    url: str
    concurrency: int = 16
    # Capability: the store objects of this process over one store may share what they read
    # and decoded (``process_caches.py``: packs and heads by the very bytes read, each use
    # compared with the bytes read now; states once the view holds every node, hashed): a
    # memory:// store, and a local folder (each store object still reads its files: it reuses
    # only what was made of the same bytes). The scope names the store: (an object standing
    # for its storage, its root); None: nothing is shared.
    shared_scope: tuple[Any, str] | None = None
    # Capability: modified times are exact (not rounded to the second, as S3's LastModified
    # is), so gc may take a grace under one second.
    exact_mtimes: bool = False
    # Capability: ``delete_unless_touched`` deletes atomically against a writer refreshing an
    # object. Without it (S3) gc lists the candidates again just before each batch it deletes.
    atomic_delete: bool = False
    # Capability: the storage keeps writers' temp files and gc's trash on disk, which gc
    # cleans (``restore_trash``, ``delete_stale_temps``).
    housekeeping: bool = False
    has_folders = False  # folders are real and their names need flushing (local disk)

    def prepare_folders(self, folders: Iterable[str], flush: bool = True) -> None:
        """Make these folders (a key layout's fan-out, such as the pack folders) and their
        names durable at once, before keys are written into them; with ``flush=False`` their
        names are made durable by the next write, before it returns. Only a backend that
        ``has_folders`` does anything."""
        return None
    # Capability: ``read_ref``'s version is the one listings give (``ObjectInfo.version``: S3's
    # ETag), so gc's summary can check that the ref it read is the one it listed.
    ref_version_listed: bool = False
    # Capability: ``list_page`` (the keys after a given one) is one request a page, as S3's
    # ``StartAfter`` is, so a large folder is listed in key ranges at once (``ranges.py``).
    # Elsewhere ``list_page`` works too (it sorts the whole listing: for a worker's share of a
    # folder, or a test), but a folder is read in one pass.
    list_after: bool = False

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The bytes of ``key``; NotFoundError if it does not exist."""

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        """Read several keys concurrently; a missing key maps to None."""
        keys = list(dict.fromkeys(keys))

        def one(key: str) -> bytes | None:
            try:
                return self.get(key)
            except NotFoundError:
                return None

        if len(keys) <= 1:
            return {k: one(k) for k in keys}
        with ThreadPoolExecutor(min(self.concurrency, len(keys))) as pool:
            return dict(zip(keys, pool.map(one, keys), strict=True))

    @abstractmethod
    def put_many(self, items: dict[str, bytes]) -> None:
        """Create each key that does not exist yet, completely or not at all."""

    @abstractmethod
    def read_ref(self, key: str) -> tuple[bytes, str] | None:
        """(bytes, version) of a ref, or None if it does not exist."""

    @abstractmethod
    def write_ref(self, key: str, data: bytes, expected: str | None,
                  refresh: Callable[[], None] | None = None) -> str:
        """Replace the ref if its version is ``expected`` (None: create it only if absent).
        Returns the new version; raises RefMismatch otherwise. ``refresh`` is called before the
        write when the update had to wait long for another writer (it re-puts the objects the
        new ref names, so a gc that ran meanwhile cannot have taken them)."""

    @abstractmethod
    def delete_ref(self, key: str, expected: str) -> None:
        """Delete the ref if its version is ``expected``; RefMismatch otherwise."""

    @abstractmethod
    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every key under ``prefix`` (a folder), with size and modified time."""

    @abstractmethod
    def delete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        """Delete keys; missing keys are ignored. Returns the keys the storage refused to
        delete (they are still there)."""

    def list_pages(self, prefix: str) -> Iterator[builtins.list[ObjectInfo]]:
        """Every key under ``prefix`` (a folder), a page at a time, each page as the storage
        gives it (S3: up to 1,000 keys a request), so a caller need not hold them all. By
        default one page: the whole ``list``."""
        yield self.list(prefix)

    async def alist_pages(self, prefix: str) -> AsyncIterator[builtins.list[ObjectInfo]]:
        """``list_pages``, awaited (by default one page: the whole ``alist``)."""
        yield await self.alist(prefix)

    def list_page(self, prefix: str, start_after: str | None = None,
                  limit: int = 1000) -> tuple[builtins.list[ObjectInfo], bool]:
        """Up to ``limit`` keys under ``prefix`` (a folder) that sort after ``start_after``
        (a key; None: from the first), in key order, and whether more follow. By default from
        the whole ``list``, sorted each call (S3: one ``ListObjectsV2`` with ``StartAfter``)."""
        infos = sorted(self.list(prefix), key=_by_key)
        at = 0 if start_after is None else bisect.bisect_right(infos, start_after, key=_by_key)
        return infos[at:at + limit], len(infos) > at + limit

    async def alist_page(self, prefix: str, start_after: str | None = None,
                         limit: int = 1000) -> tuple[builtins.list[ObjectInfo], bool]:
        """``list_page``, awaited."""
        return await self.run_blocking(self.list_page, prefix, start_after, limit)

    def list_many(self, prefixes: Iterable[str]) -> Iterable[ObjectInfo]:
        """Every key under each of ``prefixes`` (folders), listed concurrently (used by gc to
        list ``objects/00`` .. ``objects/ff`` at once)."""
        prefixes = list(prefixes)
        if len(prefixes) <= 1:
            return [i for p in prefixes for i in self.list(p)]
        with ThreadPoolExecutor(min(self.concurrency, len(prefixes))) as pool:
            return [i for part in pool.map(self.list, prefixes) for i in part]

    # --- for gc, by capability (see the flags above); blocking calls

    def delete_unless_touched(self, infos: builtins.list[ObjectInfo],
                              cutoff: float) -> builtins.list[bool]:
        """Delete each of ``infos`` unless its modified time is now at or after ``cutoff`` (a
        writer refreshed it), atomically against such a writer; True for each deleted. Only
        where ``atomic_delete``."""
        raise NotImplementedError(f"{type(self).__name__} cannot delete atomically against "
                                  "writers (atomic_delete is False)")

    def restore_trash(self) -> None:
        """Put back what a gc that died mid-sweep set aside (where ``housekeeping``)."""
        return None

    def delete_stale_temps(self, cutoff: float, dry_run: bool) -> int:
        """Delete the temp files of writers older than ``cutoff`` (none with ``dry_run``);
        returns how many there were (where ``housekeeping``)."""
        return 0

    # --- the async face: the same primitives, awaited. By default each call runs the sync
    # method on the process's thread pool for this backend's device (``_threads``: local disk
    # has no portable async I/O); memory:// answers inline and S3 is natively async (see
    # their classes).

    async_threads = 8
    # Capability: the async face is the sync one on ``run_blocking``'s pool (local disk), so a
    # step may carry out its requests one after the other in one pool thread: one hand-off an
    # operation, not one a request (``engine.steps.arun``).
    pooled: bool = False
    # Which of the process's pools this backend's blocking calls share (``_threads``): one a
    # device for local disk, whose stalled mount must not hold the threads other stores need.
    pool_key: Hashable = None

    async def run_blocking(self, fn: Callable[..., T], *args: Any) -> T:
        import asyncio  # (here: a process that never awaits a store does not import asyncio)

        return await asyncio.get_running_loop().run_in_executor(self._threads(),
                                                                partial(fn, *args))

    def hand_off(self, fn: Callable[..., T], *args: Any) -> ConcurrentFuture[T]:
        """``fn(*args)`` on this backend's thread pool (``engine.steps`` hands a step's
        requests over in one call and awaits its own future of the result)."""
        return self._threads().submit(fn, *args)

    def _threads(self) -> ThreadPoolExecutor:
        """The process's pool of ``async_threads`` threads for this backend's ``pool_key``
        (``_POOLS``), shared with every other backend object on the same device (``_pool``
        records that this one used it)."""
        key = (self.async_threads, self.pool_key)
        pool = _POOLS.get(key)
        if pool is None:
            with _POOL_LOCK:
                pool = _POOLS.get(key)
                if pool is None:
                    pool = _POOLS[key] = _Pool(self.async_threads, "cas-checkpoint-io")
        self._pool = pool
        return pool

    _pool: ThreadPoolExecutor | None = None  # (the pool this backend used, if any)

    async def aget_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        return await self.run_blocking(self.get_many, list(keys))

    async def aput_many(self, items: dict[str, bytes]) -> None:
        await self.run_blocking(self.put_many, items)

    async def aread_ref(self, key: str) -> tuple[bytes, str] | None:
        return await self.run_blocking(self.read_ref, key)

    async def aread_refs(self, keys: builtins.list[str]) -> builtins.list[tuple[bytes, str] | None]:
        """Several refs (None for a missing one), read concurrently."""
        return await self.run_blocking(self.read_refs, keys)

    async def awrite_ref(self, key: str, data: bytes, expected: str | None,
                         refresh: Callable[[], None] | None = None) -> str:
        return await self.run_blocking(self.write_ref, key, data, expected, refresh)

    async def adelete_ref(self, key: str, expected: str) -> None:
        await self.run_blocking(self.delete_ref, key, expected)

    async def alist(self, prefix: str) -> builtins.list[ObjectInfo]:
        return await self.run_blocking(self.list, prefix)

    async def alist_many(self, prefixes: Iterable[str]) -> builtins.list[ObjectInfo]:
        return builtins.list(await self.run_blocking(self.list_many, builtins.list(prefixes)))

    async def adelete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        return await self.run_blocking(self.delete_many, builtins.list(keys))

    async def aclose(self) -> None:
        """Release what the async face holds (S3: its HTTP session; the thread pool local disk
        runs on is the process's, left to the other store objects)."""
        self._pool = None

    def read_refs(self, keys: builtins.list[str]) -> builtins.list[tuple[bytes, str] | None]:
        """Several refs (None for a missing one), read concurrently."""
        if len(keys) <= 1:
            return [self.read_ref(k) for k in keys]
        with ThreadPoolExecutor(min(self.concurrency, len(keys))) as pool:
            return builtins.list(pool.map(self.read_ref, keys))


def _by_key(info: ObjectInfo) -> str:
    return info.key


def _version(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()
