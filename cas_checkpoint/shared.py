"""What the store objects over one ``memory://`` store share in this process.

A ``memory://`` store lives in this process only, and several store objects often open it (a
LangGraph saver per graph, a store per request...). Each would otherwise read, hash and parse
the same packs and heads, and join the same states, again. They share three bounded LRU caches
(one budget each for the whole process, whatever the number of stores), scoped by the
storage object (``MemoryBackend.fs``) and the store's root, never by URL alone:

* packs: a pack id -> (the bytes it was parsed from, the parsed pack). A reader still reads the
  pack's bytes from storage and reuses the parsed pack only when they are byte for byte the ones
  it was parsed (and hashed) from: a damaged or missing pack is found as before. The parsed pack
  remembers which of its objects were already re-hashed against their ids, so an object is
  hashed once per process, not once per store object;
* heads: a ref key -> (bytes, the decoded head), reused only for the same bytes;
* states: a state's root id -> its whole encoding and the ids of its nodes, for states saved
  here. The root id is the hash of the root node, which names its children by hash: the
  encoding cannot be stale. A reader uses it only once its view of the thread holds every one
  of those nodes with the right bytes (``View.check``: objects already hashed in this process
  are not hashed again), so a store that lost or damaged a node fails to load as before.

Everything here is content-addressed or compared byte for byte, so a store deleted and made
again under the same name cannot be served anything it does not hold. Encrypted stores share
nothing (their backend has no ``shared``): a store object without the key must not read what
another one decrypted.
"""

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
        body = pack._data  # (None: not decompressed yet, it holds ``data`` only)
        plain = body is None or getattr(body, "obj", None) is data  # else decompressed too
        PACKS.put((self.scope, pid), (data, pack), len(data) + (0 if plain else len(body)))

    def drop_packs(self, pids: list[str]) -> None:
        """Let go of these packs (no thread in use names them any more: ``packcache.py``)."""
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
        """Let go of a state that is no longer among its thread's newest (``warm.py``)."""
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
