"""Saves to one thread from several threads of one process take turns (``ThreadLocks``), so that
they do not race through the ref's compare-and-swap."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any


class ThreadLocks:
    """One re-entrant lock per thread id (and one ``asyncio.Lock`` per event loop and thread
    id), kept only while a caller holds or waits for it."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._locks: dict[str, tuple[threading.RLock, list[int]]] = {}
        # (loop id, thread id) -> lock, users: each entry is used by its loop's thread alone
        self._alocks: dict[tuple[int, str], tuple[Any, list[int]]] = {}

    def hold(self, thread_id: str) -> _Turn:
        """A context manager holding the thread's lock (re-entrant) while it is entered."""
        return _Turn(self, thread_id)

    @asynccontextmanager
    async def ahold(self, thread_id: str) -> AsyncIterator[None]:
        import asyncio  # (not at import: a process that only saves synchronously never needs it)

        key = (id(asyncio.get_running_loop()), thread_id)
        got = self._alocks.get(key)
        if got is None:
            got = self._alocks[key] = (asyncio.Lock(), [0])
        got[1][0] += 1
        try:
            async with got[0]:
                yield
        finally:
            got[1][0] -= 1
            if not got[1][0]:
                del self._alocks[key]

    def __len__(self) -> int:
        """Thread ids with a lock now (held or waited for), sync and async."""
        return len(self._locks) + len(self._alocks)


class _Turn:
    """``ThreadLocks.hold``: a class, not a generator (one put or put_writes enters one)."""

    __slots__ = ("_owner", "_thread_id", "_got")

    def __init__(self, owner: ThreadLocks, thread_id: str) -> None:
        self._owner = owner
        self._thread_id = thread_id
        self._got: tuple[threading.RLock, list[int]] | None = None

    def __enter__(self) -> None:
        owner = self._owner
        with owner._mutex:
            got = owner._locks.get(self._thread_id)
            if got is None:
                got = owner._locks[self._thread_id] = (threading.RLock(), [0])
            got[1][0] += 1
        try:
            got[0].acquire()
        except BaseException:
            self._release(got)
            raise
        self._got = got

    def __exit__(self, *exc: object) -> None:
        got = self._got
        assert got is not None
        self._got = None
        got[0].release()
        self._release(got)

    def _release(self, got: tuple[threading.RLock, list[int]]) -> None:
        owner = self._owner
        with owner._mutex:
            got[1][0] -= 1
            if not got[1][0]:
                del owner._locks[self._thread_id]
