"""Saves to one thread from several threads of one process take turns (``ThreadLocks``).

A thread's head changes by compare-and-swap, which is what keeps writers in different processes
and machines from losing each other's checkpoints. Writers in one process need not race
through it: a loser re-reads the head, checks whether it already holds its change, backs off
and builds its change again, which costs more than waiting. LangGraph's saver, for one, is
called from a pool of threads (a step's pending writes beside its checkpoint). So the sync
faces hold a lock per thread id around a save, and the async faces an ``asyncio.Lock`` per
event loop and thread id; the compare-and-swap still decides between processes (and between
event loops, or a sync and an async face of one process). Pure code."""

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
