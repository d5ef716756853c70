"""Pydantic AI conversations on a cas_checkpoint store (``CasConversationStore``).

Pydantic AI's ``ConversationStore`` keeps a conversation as a chain of entries (one message
each, pointing at the one before) and a record pointing at the newest. Here a conversation is
the thread ``pydantic-ai/conversation/<id>``, whose state is ``{"record": ..., "entries":
[...], "tips": {...}}``: the record, the entries of its history in order, and for each branch
the conversation left (``record.branches``) the checkpoint where that branch was the history.
The entries list is split into shared nodes by the store, so a save that appends a turn costs
about that turn, and ``read_history`` of a head reads one thread state, not an object per
message. A ``fork`` or a ``branch`` writes one checkpoint whose entries list is a prefix of one
already stored: it shares every node but the last leaf (no message is copied).

``write_record`` is a compare-and-swap on the thread's head: a stored revision other than
``expected_revision`` (or a head that moved meanwhile) raises ``ConversationConflict``.
Messages are stored as the JSON data of ``ModelMessagesTypeAdapter`` and rebuilt with it;
records with a pydantic ``TypeAdapter`` of ``ConversationRecord``. Stored data that is not a
conversation raises ``FormatError``.

``read_entry(entry_id)`` by id alone looks in the conversations this object read or wrote
lately, then through the store's conversations (a read each): the base class's own paths call
``read_history``, which finds a head in one read.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError
from pydantic_ai.conversation_store import (
    ConversationConflict,
    ConversationEntry,
    ConversationRecord,
    ConversationStore,
)
from pydantic_ai.messages import ModelMessagesTypeAdapter

from cas_checkpoint.errors import ConflictError, InvalidArgumentError, NotFoundError
from cas_checkpoint.format.objects import CheckpointId
from cas_checkpoint.integrations._names import bad_stored, name_parts, shared_store, thread_name
from cas_checkpoint.store import CheckpointStore

PREFIX = "pydantic-ai/conversation"
T = TypeVar("T")
RECORD = TypeAdapter(ConversationRecord)
KNOWN = 256  # conversations whose entries this object keeps in memory for read_entry


def _record_data(record: ConversationRecord) -> dict[str, Any]:
    out = json.loads(RECORD.dump_json(record))
    assert isinstance(out, dict)
    return out


def _entry_data(entry: ConversationEntry) -> dict[str, Any]:
    message = json.loads(ModelMessagesTypeAdapter.dump_json([entry.message]))[0]
    return {"id": entry.id, "parent_id": entry.parent_id, "kind": entry.kind,
            "message": message}


class _State:
    """A conversation thread's state, checked for shape; entries decoded on demand."""

    def __init__(self, raw: Any, where: str, cid: CheckpointId | None = None) -> None:
        self.cid = cid  # the checkpoint of thread ``where`` that holds this state
        if not isinstance(raw, dict) or not isinstance(raw.get("entries"), list) or \
                not isinstance(raw.get("tips", {}), dict):
            raise bad_stored("Pydantic AI conversation", where, "no 'entries' list")
        self.where = where
        self.raw_record = raw.get("record")
        self.entries: list[dict[str, Any]] = raw["entries"]
        for i, e in enumerate(self.entries):
            if not isinstance(e, dict) or not isinstance(e.get("id"), str):
                raise bad_stored("Pydantic AI conversation", where, f"entry {i} has no id")
        self.tips: dict[str, str] = {str(k): str(v) for k, v in raw.get("tips", {}).items()}

    def record(self) -> ConversationRecord:
        try:
            return RECORD.validate_json(json.dumps(self.raw_record))
        except (ValidationError, TypeError, ValueError) as e:
            raise bad_stored("Pydantic AI record", self.where, str(e).splitlines()[0]) from None

    def index(self, entry_id: str) -> int | None:
        for i in range(len(self.entries) - 1, -1, -1):
            if self.entries[i]["id"] == entry_id:
                return i
        return None

    def decoded(self, upto: int, limit: int | None = None) -> list[ConversationEntry]:
        """Entries ``0..upto`` (the last ``limit`` of them) as ConversationEntry objects, their
        messages validated in one call of Pydantic AI's own adapter."""
        start = 0 if limit is None else max(0, upto + 1 - limit)
        picked = self.entries[start:upto + 1]
        try:
            messages = ModelMessagesTypeAdapter.validate_json(
                json.dumps([e.get("message") for e in picked]))
            return [ConversationEntry(id=e["id"], parent_id=e.get("parent_id"), message=m)
                    for e, m in zip(picked, messages, strict=True)]
        except (ValidationError, TypeError, ValueError) as e:
            raise bad_stored("Pydantic AI message", self.where,
                             str(e).splitlines()[0]) from None


class CasConversationStore(ConversationStore):
    """Pydantic AI's ``ConversationStore`` on the store at ``store`` (a URL such as
    ``./conversations``, ``memory://name`` or ``s3://bucket/prefix``, opened with
    ``open_options``, the keyword arguments of ``CheckpointStore.open``; or an open
    ``CheckpointStore``). Blocking store calls run in a worker thread, so one object works
    from any event loop (``agent.run_sync`` included)."""

    def __init__(self, store: str | CheckpointStore, **open_options: Any) -> None:
        self.store = shared_store(store, open_options)
        # conversation thread -> (checkpoint id, state) read or written lately
        self._known: OrderedDict[str, tuple[CheckpointId, _State]] = OrderedDict()

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.to_thread(fn)

    # --- blocking steps ---

    def _remember(self, name: str, cid: CheckpointId, state: _State) -> None:
        self._known[name] = (cid, state)
        self._known.move_to_end(name)
        while len(self._known) > KNOWN:
            self._known.popitem(last=False)

    def _load(self, name: str, cid: CheckpointId | None = None
              ) -> tuple[CheckpointId, _State] | None:
        known = self._known.get(name)
        if cid is not None and known is not None and known[0] == cid:
            return known
        try:
            cp = self.store.load(name, cid)
        except NotFoundError:
            return None
        state = _State(cp.state, name, cp.id)
        if cid is None:
            self._remember(name, cp.id, state)
        return cp.id, state

    def _find(self, entry_id: str, hint: Sequence[str] = ()) -> tuple[_State, int] | None:
        """The state whose entries hold ``entry_id``: in the threads named by ``hint``, those
        known, then every conversation (and each one's branch tips)."""
        def stored() -> Iterator[str]:  # listed only if the known ones do not hold it
            yield from (t for t in self.store.threads() if name_parts(PREFIX, t, 1) is not None)

        seen: set[str] = set()
        for name in chain(hint, list(reversed(self._known)), stored()):
            if name in seen:
                continue
            seen.add(name)
            got = self._known.get(name) if name in self._known else self._load(name)
            if got is None:
                continue
            state = got[1]
            i = state.index(entry_id)
            if i is not None:
                return state, i
            for tip_cid in state.tips.values():
                tipped = self._load(name, CheckpointId(tip_cid))
                if tipped is not None and (j := tipped[1].index(entry_id)) is not None:
                    return tipped[1], j
        return None

    def _sync_read_record(self, conversation_id: str) -> ConversationRecord | None:
        got = self._load(thread_name(PREFIX, conversation_id))
        return got[1].record() if got is not None else None

    def _sync_read_records(self, scope: str | None, limit: int | None) -> list[ConversationRecord]:
        rows = []
        for name in self.store.threads():
            if name_parts(PREFIX, name, 1) is None:
                continue
            infos = self.store.history(name, limit=1)
            if not infos:
                continue
            meta = infos[0].metadata
            if scope is not None and meta.get("scope") != scope:
                continue
            rows.append((float(meta.get("updated_at", 0.0)), name))
        rows.sort(reverse=True)
        out = []
        for _, name in rows[:limit]:
            got = self._load(name)
            if got is not None:
                out.append(got[1].record())
        return out

    def _sync_write_record(self, record: ConversationRecord,
                           new_entries: Sequence[ConversationEntry],
                           expected_revision: str | None) -> None:
        conv = record.conversation_id
        name = thread_name(PREFIX, conv)
        current = self._load(name)
        stored = current[1].record() if current is not None else None
        if (stored.revision if stored is not None else None) != expected_revision:
            raise ConversationConflict(conv)
        new = [_entry_data(e) for e in new_entries]
        base_id = new_entries[0].parent_id if new_entries else record.head_id
        hint = [name] + ([thread_name(PREFIX, record.forked_from)] if record.forked_from else [])
        found = None
        if base_id is None:
            base: list[dict[str, Any]] = []
        else:
            found = self._find(base_id, hint)
            if found is None:
                raise ConversationConflict(conv)  # the entry it names is gone
            base = found[0].entries[:found[1] + 1]
        entries = base + new
        if record.head_id is not None and (not entries or entries[-1]["id"] != record.head_id):
            raise ConversationConflict(conv)
        tips: dict[str, str] = {}
        if current is not None:
            cid, state = current
            tips = {t: c for t, c in state.tips.items() if t in record.branches}
            old_head = state.entries[-1]["id"] if state.entries else None
            if old_head is not None and old_head in record.branches and old_head not in tips:
                tips[old_head] = cid
        data = {"record": _record_data(record), "entries": entries, "tips": tips}
        meta = {"updated_at": record.updated_at.timestamp(), "scope": record.scope,
                "head_id": record.head_id}
        expected = current[0] if current else None
        try:
            if current is None and found is not None and found[0].where != name and \
                    found[0].cid is not None:
                # a fork: start the thread at the checkpoint holding its history, so the save
                # below shares that history's nodes instead of writing them again
                expected = self.store.fork(found[0].where, found[0].cid, name).id
            info = self.store.save(name, data, expected_head=expected, metadata=meta)
        except (ConflictError, InvalidArgumentError):
            raise ConversationConflict(conv) from None
        self._remember(name, info.id, _State(data, name, info.id))

    def _sync_delete_record(self, conversation_id: str, expected_revision: str) -> None:
        name = thread_name(PREFIX, conversation_id)
        current = self._load(name)
        if current is None or current[1].record().revision != expected_revision:
            raise ConversationConflict(conversation_id)
        try:  # (a head that moved meanwhile: the delete is refused, as a CAS)
            self.store.delete(name, *[i.id for i in self.store.history(name)],
                              expected_head=current[0])
        except (ConflictError, NotFoundError):
            raise ConversationConflict(conversation_id) from None
        self._known.pop(name, None)

    def _sync_read_history(self, head_id: str | None, limit: int | None) -> list[ConversationEntry]:
        if head_id is None or limit == 0:
            return []
        found = self._find(head_id)
        if found is None:
            raise KeyError(head_id)
        state, i = found
        return state.decoded(i, limit)

    # --- the ConversationStore primitives ---

    async def read_record(self, conversation_id: str) -> ConversationRecord | None:
        return await self._run(lambda: self._sync_read_record(conversation_id))

    async def read_records(self, *, scope: str | None = None,
                           limit: int | None = None) -> Sequence[ConversationRecord]:
        """Newest ``updated_at`` first: a log read per conversation (its newest checkpoint's
        metadata), and a state read for each one returned."""
        return await self._run(lambda: self._sync_read_records(scope, limit))

    async def write_record(self, record: ConversationRecord, *,
                           new_entries: Sequence[ConversationEntry] = (),
                           expected_revision: str | None) -> None:
        await self._run(lambda: self._sync_write_record(record, new_entries, expected_revision))

    async def delete_record(self, conversation_id: str, *, expected_revision: str) -> None:
        """Delete a conversation's thread. Its entries stay in the store's objects while any
        other conversation (a fork) shares them, and until ``gc`` otherwise."""
        await self._run(lambda: self._sync_delete_record(conversation_id, expected_revision))

    async def read_entry(self, entry_id: str) -> ConversationEntry:
        def one() -> ConversationEntry:
            found = self._find(entry_id)
            if found is None:
                raise KeyError(entry_id)
            return found[0].decoded(found[1], 1)[0]

        return await self._run(one)

    async def read_history(self, head_id: str | None, *,
                           limit: int | None = None) -> list[ConversationEntry]:
        """The history up to ``head_id`` from the one conversation state that holds it (the
        one just read by ``read_record`` when it is that record's head): one read."""
        return await self._run(lambda: self._sync_read_history(head_id, limit))

