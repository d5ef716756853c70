"""What the store objects over one store share in this process: bounded LRUs of packs, states
and heads. A ``memory://`` store's bytes live in this process anyway; a local folder's are read
from disk by each store object, and what it decoded is used again only for the very bytes read
now (a pack, a ref: compared whole) or once the view is seen to hold every node (a state): a
new saver per request, or a server's other store objects, then skip hashing, decompressing and
parsing again what this process read or wrote. Local folders share less (``LOCAL_*``: bounded
by count too), so a long-lived process's memory settles soon whatever the threads it touches."""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any

from cas_checkpoint.backends.base import DiskScope

PACK_BYTES = 128 << 20  # packs kept for all memory:// stores of this process together
STATE_BYTES = 64 << 20  # state encodings, likewise
HEAD_BYTES = 16 << 20  # decoded heads (counted by their stored size), likewise
ITEM_MAX = 16 << 20  # nothing bigger is kept
MAX_STORES = 4096  # stores remembered per storage object
LOCAL_PACK_BYTES = 32 << 20  # local folders: packs, at most this many bytes...
LOCAL_PACKS = 1024  # ...and this many packs
LOCAL_STATE_BYTES = 16 << 20  # state encodings (a save's), at most...
LOCAL_STATES = 256  # ...of this many states (the newest of the threads saved last)
LOCAL_HEAD_BYTES = 4 << 20  # decoded heads, at most...
LOCAL_HEADS = 1024  # ...of this many refs


class _LRU:
    """A bounded LRU of (key -> value), each entry counted by a size the caller gives."""

    def __init__(self, limit: int, count: int | None = None) -> None:
        self.limit = limit
        self.count = count  # entries kept at most (None: bounded by bytes only)
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
            while self.bytes > self.limit or (self.count is not None
                                                and len(self.items) > self.count):
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
LOCAL = (_LRU(LOCAL_PACK_BYTES, LOCAL_PACKS), _LRU(LOCAL_STATE_BYTES, LOCAL_STATES),
         _LRU(LOCAL_HEAD_BYTES, LOCAL_HEADS))  # (packs, states, heads) of local folders


def clear() -> None:
    """Forget everything shared (tests: as if another process had written the stores)."""
    for lru in (PACKS, STATES, HEADS, *LOCAL):
        lru.clear()


class Shared:
    """One store's view of the process-wide caches (its ``scope`` keys its entries)."""

    __slots__ = ("__weakref__", "heads", "packs", "scope", "states")

    def __init__(self, local: bool = False) -> None:
        self.scope = object()  # identity only: entries of another store never match
        self.packs, self.states, self.heads = LOCAL if local else (PACKS, STATES, HEADS)

    def pack(self, pid: str, data: bytes) -> Any:
        """The pack parsed from exactly ``data`` (its stored bytes), or None."""
        got = self.packs.get((self.scope, pid))
        if got is None or got[0] is not data and got[0] != data:
            return None
        return got[1]

    def keep_pack(self, pid: str, data: bytes, pack: Any) -> None:
        body = pack._data  # (None: not decompressed yet, it holds ``data`` only)
        plain = body is None or getattr(body, "obj", None) is data  # else decompressed too
        self.packs.put((self.scope, pid), (data, pack), len(data) + (0 if plain else len(body)))

    def drop_packs(self, pids: list[str]) -> None:
        """Let go of these packs (no thread in use names them any more: ``pack_cache.py``)."""
        for pid in pids:
            self.packs.drop((self.scope, pid))

    def head(self, key: str, data: bytes) -> Any:
        got = self.heads.get((self.scope, key))
        if got is None or got[0] != data:
            return None
        return got[1]

    def keep_head(self, key: str, data: bytes, head: Any) -> None:
        self.heads.put((self.scope, key), (data, head), len(data))

    def state(self, root: str) -> tuple[bytes, frozenset[str]] | None:
        """A state's encoding and the ids of its nodes (a reader checks that its view holds
        them before it uses the encoding: a store that lost or damaged a node says so)."""
        got: tuple[bytes, frozenset[str]] | None = self.states.get((self.scope, root))
        return got

    def keep_state(self, root: str, data: bytes, nodes: frozenset[str]) -> None:
        self.states.put((self.scope, root), (data, nodes), len(data) + 80 * len(nodes))

    def drop_state(self, root: str) -> None:
        """Let go of a state that is no longer among its thread's newest (``caches.py``)."""
        self.states.drop((self.scope, root))


_SCOPES: weakref.WeakKeyDictionary[Any, dict[str, Shared]] = weakref.WeakKeyDictionary()
_SCOPES_LOCK = threading.Lock()


def for_store(storage: Any, root: str) -> Shared:
    """The shared caches of the store at ``root`` in ``storage`` (a filesystem object; a local
    folder's, ``DISK``, share the ``LOCAL`` caches)."""
    local = isinstance(storage, DiskScope)
    with _SCOPES_LOCK:
        try:
            roots = _SCOPES.setdefault(storage, {})
        except TypeError:  # not weakly referable: this store shares nothing
            return Shared(local)
        got = roots.get(root)
        if got is None:
            if len(roots) >= MAX_STORES:  # (their entries age out of the LRUs)
                roots.clear()
            got = roots[root] = Shared(local)
        return got
