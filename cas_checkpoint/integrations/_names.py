"""What the framework adapters share: thread names made of parts, and opening a store lazily.

A framework's session (an app, a user, a session id) is one thread of the store, named
``prefix/part/part/...`` with each part percent-encoded, so any string is a valid part and a
thread name splits back into the same parts. Frameworks build their services outside a running
event loop (an ADK ``Runner``, an Agents SDK ``Session``) while an S3 store's async session is
bound to the loop that opens it: ``LazyStore`` opens the store at the first awaited call.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote

from cas_checkpoint.aio import AsyncCheckpointStore
from cas_checkpoint.errors import FormatError
from cas_checkpoint.store import CheckpointStore

_STORES: dict[str, CheckpointStore] = {}
_STORES_LOCK = threading.Lock()


def shared_store(store: str | CheckpointStore, options: Mapping[str, Any]) -> CheckpointStore:
    """One blocking store object per URL and options in this process (the sessions of one
    store share its caches and its per-thread turn-taking), or ``store`` itself."""
    if isinstance(store, CheckpointStore):
        return store
    key = f"{store}\0{sorted(options.items())!r}"
    with _STORES_LOCK:
        if key not in _STORES:
            _STORES[key] = CheckpointStore.open(store, **options)
        return _STORES[key]


def thread_name(prefix: str, *parts: str) -> str:
    """``prefix/p1/p2...`` with every part percent-encoded (no part can add a ``/``)."""
    return "/".join([prefix, *(quote(p, safe="") for p in parts)])


def name_parts(prefix: str, name: str, count: int) -> tuple[str, ...] | None:
    """The ``count`` parts of a thread named by ``thread_name(prefix, ...)``, else None."""
    if not name.startswith(prefix + "/"):
        return None
    parts = name[len(prefix) + 1:].split("/")
    if len(parts) != count:
        return None
    return tuple(unquote(p) for p in parts)


def bad_stored(what: str, where: str, why: object) -> FormatError:
    """The error for stored data that is not what an adapter writes (hostile or foreign)."""
    return FormatError(
        f"the stored {what} in thread {where!r} is not one this adapter wrote ({why}); "
        "check that the store URL is the one the adapter writes to, or delete that thread "
        "(CheckpointStore.delete_thread) if it was damaged"
    )


class LazyStore:
    """An ``AsyncCheckpointStore`` opened from ``url`` at first use, in the running loop."""

    def __init__(self, store: str | AsyncCheckpointStore,
                 open_options: Mapping[str, Any] | None = None) -> None:
        self._store = store if isinstance(store, AsyncCheckpointStore) else None
        self._url = None if isinstance(store, AsyncCheckpointStore) else str(store)
        self._options = dict(open_options or {})
        self._owned = self._store is None
        self._lock: asyncio.Lock | None = None

    async def get(self) -> AsyncCheckpointStore:
        if self._store is None:
            if self._lock is None:
                self._lock = asyncio.Lock()
            async with self._lock:
                if self._store is None:
                    assert self._url is not None
                    self._store = await AsyncCheckpointStore.open(self._url, **self._options)
        return self._store

    async def aclose(self) -> None:
        """Close the store if this object opened it (a store passed in stays open)."""
        if self._owned and self._store is not None:
            store, self._store = self._store, None
            await store.aclose()
