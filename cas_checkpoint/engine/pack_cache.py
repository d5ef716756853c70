"""The packs a store object keeps in memory: an LRU bounded by bytes (each pack at its plain
size) that also lets go of the packs no thread in use names."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Generic, Protocol, TypeVar

from cas_checkpoint.format.heads import Head, PackRef


class Cached(Protocol):
    """What the cache needs of a pack (``pack_reads.Pack``)."""

    @property
    def id(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def data(self) -> memoryview: ...
    @property
    def held(self) -> int: ...


Pack = TypeVar("Pack", bound=Cached)

OWNED_THREADS = 64  # threads whose newest head's packs are known (the threads in use)


def held(pack: Cached) -> int:
    """The bytes a cached pack holds in memory when it is cached (``Pack.held``): its plain
    body (a compressed pack's is bigger than the stored pack, by its compression ratio), or
    the stored bytes (also of a pack whose body is not decompressed yet: ``PackCache`` counts
    each pack at what it held when it came, so its sum stays exact)."""
    return pack.held


class PackCache(Generic[Pack]):
    """Packs by id, least recently used first, at most ``limit`` bytes (see the module)."""

    def __init__(self, limit: int, on_release: Callable[[list[str]], None] | None = None
                 ) -> None:
        self.on_release = on_release  # told the packs no tracked thread names any more
        self.packs: OrderedDict[str, Pack] = OrderedDict()
        self.bytes = 0
        self.limit = limit
        self.lock = threading.Lock()
        self._owners: OrderedDict[str, frozenset[str]] = OrderedDict()  # thread -> its packs
        self._named: dict[str, tuple[PackRef, ...]] = {}  # thread -> the packs tuple they are of
        self._uses: dict[str, int] = {}  # pack id -> how many tracked threads name it
        self._counted: dict[str, int] = {}  # pack id -> the bytes ``bytes`` counts it at

    def remember(self, pack: Pack, size: int | None = None) -> None:
        """Keep ``pack``, counted at ``size`` (default: what it holds, ``held``)."""
        with self.lock:
            if pack.id in self.packs:
                self.packs.move_to_end(pack.id)
                return
            self.packs[pack.id] = pack
            size = self._counted[pack.id] = held(pack) if size is None else size
            self.bytes += size
            while self.bytes > self.limit and len(self.packs) > 1:
                old, _ = self.packs.popitem(last=False)
                self.bytes -= self._counted.pop(old)

    def get(self, pid: str) -> Pack | None:
        with self.lock:
            pack = self.packs.get(pid)
            if pack is not None:
                self.packs.move_to_end(pid)
            return pack

    def forget(self, pids: Iterable[str]) -> None:
        with self.lock:
            self._drop(pids)

    def _drop(self, pids: Iterable[str]) -> None:
        for pid in pids:
            if self.packs.pop(pid, None) is not None:
                self.bytes -= self._counted.pop(pid)

    def own(self, head: Head) -> None:
        """``head`` is its thread's newest head this object knows of: the packs it names are
        the thread's; those its previous head named and it does not, and those of a thread
        no longer among the ``OWNED_THREADS`` used last, are let go of unless another tracked
        thread names them."""
        thread, packs = head.thread_id, head.packs
        with self.lock:  # (most commits: the packs its last head named, new objects inline)
            if self._named.get(thread) is packs:
                self._owners.move_to_end(thread)
                return
        pids = frozenset(p.id for p in packs)
        gone: list[str] = []
        with self.lock:
            old = self._owners.pop(thread, frozenset())
            self._owners[thread] = pids
            self._named[thread] = packs
            if old != pids:
                self._release(old - pids, gone)
                self._add(pids - old)
            while len(self._owners) > OWNED_THREADS:
                dropped, owned = self._owners.popitem(last=False)
                self._named.pop(dropped, None)
                self._release(owned, gone)
        if gone and self.on_release is not None:
            self.on_release(gone)

    def _add(self, pids: Iterable[str]) -> None:
        uses = self._uses
        for pid in pids:
            uses[pid] = uses.get(pid, 0) + 1

    def _release(self, pids: Iterable[str], gone: list[str]) -> None:
        uses, start = self._uses, len(gone)
        for pid in pids:
            n = uses.get(pid, 0) - 1
            if n > 0:
                uses[pid] = n
            else:
                uses.pop(pid, None)
                gone.append(pid)
        self._drop(gone[start:])
