"""What the store objects over one ``memory://`` store share in this process: bounded LRUs of
packs, states and heads."""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any

PACK_BYTES = 128 << 20  # packs kept for all memory:// stores of this process together
STATE_BYTES = 64 << 20  # state encodings, likewise
HEAD_BYTES = 16 << 20  # decoded heads (counted by their stored size), likewise
ITEM_MAX = 16 << 20  # nothing bigger is kept
MAX_STORES = 4096  # stores remembered per storage object


class _LRU:
    """A bounded LRU of (key -> value), each entry counted by a size the caller gives."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: OrderedDict[Any, tuple[int, Any]] = OrderedDict()
        self.bytes = 0
        self.lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self.lock:
            got = self.items.get(key)
            if got is None:
                return None
            self.items.move_to_end(key)
            return got[1]

    def put(self, key: Any, value: Any, size: int) -> None:
        if size > min(ITEM_MAX, self.limit):
            return
        with self.lock:
            old = self.items.pop(key, None)
            if old is not None:
                self.bytes -= old[0]
            self.items[key] = (size, value)
            self.bytes += size
            while self.bytes > self.limit:
                self.bytes -= self.items.popitem(last=False)[1][0]

    def drop(self, key: Any) -> None:
        with self.lock:
            old = self.items.pop(key, None)
            if old is not None:
                self.bytes -= old[0]

    def clear(self) -> None:
        with self.lock:
            self.items.clear()
            self.bytes = 0


PACKS = _LRU(PACK_BYTES)
STATES = _LRU(STATE_BYTES)
HEADS = _LRU(HEAD_BYTES)


class Shared:
    """One store's view of the process-wide caches (its ``scope`` keys its entries)."""

    __slots__ = ("__weakref__", "scope")

    def __init__(self) -> None:
        self.scope = object()  # identity only: entries of another store never match

    def pack(self, pid: str, data: bytes) -> Any:
        """The pack parsed from exactly ``data`` (its stored bytes), or None."""
        got = PACKS.get((self.scope, pid))
        if got is None or got[0] is not data and got[0] != data:
            return None
        return got[1]

    def keep_pack(self, pid: str, data: bytes, pack: Any) -> None:
        plain = getattr(pack.data, "obj", None) is data  # else decompressed (or opened) too
        PACKS.put((self.scope, pid), (data, pack), len(data) + (0 if plain else len(pack.data)))

    def drop_packs(self, pids: list[str]) -> None:
        """Let go of these packs (no thread in use names them any more: ``pack_cache.py``)."""
        for pid in pids:
            PACKS.drop((self.scope, pid))

    def head(self, key: str, data: bytes) -> Any:
        got = HEADS.get((self.scope, key))
        if got is None or got[0] != data:
            return None
        return got[1]

    def keep_head(self, key: str, data: bytes, head: Any) -> None:
        HEADS.put((self.scope, key), (data, head), len(data))

    def state(self, root: str) -> tuple[bytes, frozenset[str]] | None:
        """A state's encoding and the ids of its nodes (a reader checks that its view holds
        them before it uses the encoding: a store that lost or damaged a node says so)."""
        got: tuple[bytes, frozenset[str]] | None = STATES.get((self.scope, root))
        return got

    def keep_state(self, root: str, data: bytes, nodes: frozenset[str]) -> None:
        STATES.put((self.scope, root), (data, nodes), len(data) + 80 * len(nodes))

    def drop_state(self, root: str) -> None:
        """Let go of a state that is no longer among its thread's newest (``caches.py``)."""
        STATES.drop((self.scope, root))


_SCOPES: weakref.WeakKeyDictionary[Any, dict[str, Shared]] = weakref.WeakKeyDictionary()
_SCOPES_LOCK = threading.Lock()


def for_store(storage: Any, root: str) -> Shared:
    """The shared caches of the store at ``root`` in ``storage`` (a filesystem object)."""
    with _SCOPES_LOCK:
        try:
            roots = _SCOPES.setdefault(storage, {})
        except TypeError:  # not weakly referable: this store shares nothing
            return Shared()
        got = roots.get(root)
        if got is None:
            if len(roots) >= MAX_STORES:  # (their entries age out of the LRUs)
                roots.clear()
            got = roots[root] = Shared()
        return got
