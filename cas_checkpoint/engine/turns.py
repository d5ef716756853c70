"""Saves to one thread from several threads of one process take turns (``ThreadLocks``), so that
they do not race through the ref's compare-and-swap."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any


class ThreadLocks:
    """One re-entrant lock per thread id (and one ``asyncio.Lock`` per event loop and thread
    id), kept only while a caller holds or waits for it."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._locks: dict[str, tuple[threading.RLock, list[int]]] = {}
        # (loop id, thread id) -> lock, users: each entry is used by its loop's thread alone
        self._alocks: dict[tuple[int, str], tuple[Any, list[int]]] = {}

    @contextmanager
    def hold(self, thread_id: str) -> Iterator[None]:
        with self._mutex:
            got = self._locks.get(thread_id)
            if got is None:
                got = self._locks[thread_id] = (threading.RLock(), [0])
            got[1][0] += 1
        try:
            with got[0]:
                yield
        finally:
            with self._mutex:
                got[1][0] -= 1
                if not got[1][0]:
                    del self._locks[thread_id]

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
