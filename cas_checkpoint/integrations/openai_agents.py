"""OpenAI Agents SDK sessions on a cas_checkpoint store (``CasSession``).

``CasSession(session_id, store)`` implements the SDK's ``Session`` protocol: the session is the
thread ``agents/session/<session id>`` whose state is ``{"items": [...]}``, and every
``add_items``/``pop_item`` saves one checkpoint. The items list is split into shared nodes by
the store, so one more turn costs about one turn. ``fork`` and ``branch_from_turn`` start a new
session that shares the old one's items (a ref, or a ref and one truncated list: never a
copy), unlike ``AdvancedSQLiteSession``'s branches, which copy rows.

Items are the SDK's JSON-able dicts (``TResponseInputItem``) and are stored as that data;
stored data that is not a list of dicts raises ``FormatError``. Two writers never lose an
item: ``add_items`` and ``pop_item`` are compare-and-swaps on the session's head, retried.

The session runs the blocking ``CheckpointStore`` in a worker thread (as the SDK's
``SQLiteSession`` runs sqlite3), so one session object works from any event loop, including
``Runner.run_sync``'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from agents.memory.session import SessionABC
from agents.memory.session_settings import (
    SessionSettings,
    coerce_session_settings,
    resolve_session_limit,
)
from pydantic_core import to_jsonable_python

from cas_checkpoint.errors import ConflictError, InvalidArgumentError, NotFoundError
from cas_checkpoint.format.objects import CheckpointId
from cas_checkpoint.integrations._names import bad_stored, shared_store, thread_name
from cas_checkpoint.store import CheckpointStore

PREFIX = "agents/session"
CAS_RETRIES = 64
T = TypeVar("T")

def _items(raw: Any, where: str) -> list[Any]:
    if not isinstance(raw, dict) or not isinstance(raw.get("items"), list):
        raise bad_stored("Agents SDK session", where, "no 'items' list")
    items: list[Any] = raw["items"]
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise bad_stored("Agents SDK session", where,
                             f"item {i} is a {type(item).__name__}, not a dict")
    return items


class CasSession(SessionABC):
    """The Agents SDK ``Session`` on the store at ``store`` (a URL such as ``./sessions``,
    ``memory://name`` or ``s3://bucket/prefix``, opened with ``open_options``, the keyword
    arguments of ``CheckpointStore.open``; or an open ``CheckpointStore``)."""

    def __init__(self, session_id: str, store: str | CheckpointStore, *,
                 session_settings: SessionSettings | Mapping[str, Any] | None = None,
                 **open_options: Any) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise InvalidArgumentError(
                f"session_id must be a non-empty str, not {session_id!r}")
        self.session_id = session_id
        self.session_settings = (coerce_session_settings(dict(session_settings))
                                 if isinstance(session_settings, Mapping)
                                 else session_settings or SessionSettings())
        self.store = shared_store(store, open_options)
        self.thread_id = thread_name(PREFIX, session_id)
        self._closed = False

    def close(self) -> None:
        """Refuse further calls on this object (the store, shared by the sessions of its URL,
        stays open; the items stay stored)."""
        self._closed = True

    async def _run(self, fn: Callable[[], T]) -> T:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed; make a new one with the "
                               "same session_id to go on")
        return await asyncio.to_thread(fn)

    # --- blocking steps (run in a worker thread) ---

    def _read(self) -> tuple[CheckpointId | None, list[Any]]:
        try:
            cp = self.store.load(self.thread_id)
        except NotFoundError:
            return None, []
        return cp.id, _items(cp.state, self.thread_id)

    def _update(self, change: Callable[[list[Any]], tuple[list[Any], T]]) -> T:
        """Apply ``change`` to the items by compare-and-swap, retried while others write."""
        for _ in range(CAS_RETRIES):
            head, items = self._read()
            new, out = change(items)
            if new is items:
                return out
            try:
                self.store.save(self.thread_id, {"items": new}, expected_head=head,
                                metadata={"count": len(new)})
                return out
            except ConflictError:
                continue
        raise ConflictError(self.thread_id, None, None)

    # --- the Session protocol ---

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The session's items, oldest first; with ``limit`` (or ``session_settings.limit``)
        the latest ``limit`` of them (0: none)."""
        n = resolve_session_limit(limit, self.session_settings)
        _, items = await self._run(self._read)
        if n is None or n < 0:
            return list(items)
        return list(items[max(0, len(items) - n):]) if n else []

    async def add_items(self, items: list[Any]) -> None:
        if self._closed or not items:
            await self._run(lambda: None)  # (a closed session raises, even for [])
            return
        data = to_jsonable_python(list(items))
        await self._run(lambda: self._update(lambda old: ([*old, *data], None)))

    async def pop_item(self) -> Any | None:
        def pop(old: list[Any]) -> tuple[list[Any], Any | None]:
            return (old[:-1], old[-1]) if old else (old, None)

        return await self._run(lambda: self._update(pop))

    async def clear_session(self) -> None:
        def clear() -> None:
            try:
                self.store.delete_thread(self.thread_id)
            except NotFoundError:
                pass

        await self._run(clear)

    # --- beyond the protocol: O(1) branches ---

    def _fork(self, new_session_id: str, keep: int | None) -> CasSession:
        new = CasSession(new_session_id, self.store, session_settings=self.session_settings)
        if self.store.head(new.thread_id) is not None:
            raise InvalidArgumentError(
                f"session {new_session_id!r} already exists; pass another new_session_id or "
                "clear_session() it first")
        head, items = self._read()
        if head is None:
            raise NotFoundError(f"session {self.session_id!r} has no items to fork")
        if keep is None or keep >= len(items):
            self.store.fork(self.thread_id, head, new.thread_id)
            return new
        # the newest checkpoint that held at least ``keep`` items, from the log (no states)
        at = head
        for info in self.store.history(self.thread_id):
            count = info.metadata.get("count")
            if isinstance(count, int) and count >= keep:
                at = info.id
            if isinstance(count, int) and count < keep:
                break
        self.store.fork(self.thread_id, at, new.thread_id)
        if len(_items(self.store.load(new.thread_id).state, new.thread_id)) != keep:
            # cut the list: the new state shares every leaf but the last with the old one
            self.store.save(new.thread_id, {"items": items[:keep]}, metadata={"count": keep})
        return new

    async def fork(self, new_session_id: str, *, keep: int | None = None) -> CasSession:
        """A new session holding this one's items (the first ``keep`` of them), sharing them:
        a ref when a save ended there, else a ref and one truncated list."""
        return await self._run(lambda: self._fork(new_session_id, keep))

    async def branch_from_turn(self, turn_number: int, new_session_id: str) -> CasSession:
        """A new session holding the items before the ``turn_number``-th user message (1 is
        the first), to send another message there (``AdvancedSQLiteSession`` copies rows for
        this; here the items are shared)."""
        _, items = await self._run(self._read)
        users = [i for i, item in enumerate(items) if item.get("role") == "user"]
        if not 1 <= turn_number <= len(users):
            raise InvalidArgumentError(
                f"turn_number {turn_number} is not a user turn of session {self.session_id!r} "
                f"(it has {len(users)}; the first is 1)")
        return await self.fork(new_session_id, keep=users[turn_number - 1])
