"""What CasSaver's reads and writes decide, as steps (``cas_checkpoint.engine.steps``): one
implementation that the sync and the async face both run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
    writes_sort_key,
)

from cas_checkpoint.engine.archive import InArchive
from cas_checkpoint.engine.commit import Part
from cas_checkpoint.engine.commit import commit as commit_parts
from cas_checkpoint.engine.core import Core
from cas_checkpoint.engine.model import CheckpointInfo
from cas_checkpoint.engine.refs import Ref
from cas_checkpoint.engine.steps import Step
from cas_checkpoint.errors import ConflictError, InvalidArgumentError, NotFoundError
from cas_checkpoint.format.heads import Head
from cas_checkpoint.format.objects import CheckpointId, LogEntry
from cas_checkpoint.integrations.langgraph.cursor import (
    EARLY,
    MAX_EARLY,
    MAX_KEY,
    WRITES_FROM,
    Cursor,
    Short,
    lg_of,
)
from cas_checkpoint.integrations.langgraph.encode import PutEncoder
from cas_checkpoint.integrations.langgraph.keys import _config, _key, _parse, _target
from cas_checkpoint.integrations.langgraph.meta import from_log, to_log

T = TypeVar("T")

RECENT = 16  # checkpoints whose states the delta-channel walk loads in one batch


def shallow(entries: list[LogEntry]) -> list[LogEntry]:
    """What a shallow saver keeps of a namespace's log (oldest first, the new entry last): its
    latest LangGraph checkpoint and the pending writes to it (an ``engine`` ``Retain``)."""
    latest = next((e.metadata["lg"] for e in reversed(entries) if "lg" in e.metadata), None)
    return [e for e in entries
            if latest is not None and latest in (e.metadata.get("lg"), e.metadata.get("w"))]


def _early(cursor: Cursor) -> dict[str, str]:
    """The ``lge`` map the newest entry of ``cursor``'s log carries (a copy)."""
    newest = cursor.newest()
    got = None if newest is None else newest.metadata.get(EARLY)
    return {str(k): str(v) for k, v in got.items()} if isinstance(got, dict) else {}


class Steps:
    """The reads and writes of CasSaver, over ``self._core``."""

    _core: Core
    _encoder: PutEncoder
    conflicts: str
    shallow: bool

    def _prune(self, thread_ids: Sequence[str], strategy: str, only_ns: str | None = None
               ) -> Step[None]:  # pragma: no cover - walks.py has it
        raise NotImplementedError

    def _all(self, name: str) -> Step[list[CheckpointInfo]]:
        """A store thread's entries (metadata only), newest first; [] if it does not exist.
        A thread whose ref names what is missing raises (it is damaged, not empty)."""
        try:
            got: list[CheckpointInfo] = yield from self._core.history(name)
        except NotFoundError:
            if (yield from self._core.refs.read(name)) is None:
                return []  # (no such thread)
            raise
        return got

    def _entries(self, name: str, every: list[CheckpointInfo] | None = None
                 ) -> Step[list[CheckpointInfo]]:
        """LangGraph's checkpoints in a store thread (not its writes), newest first (of
        ``every``, its entries as ``_all`` gives them, when the caller read them already)."""
        return [e for e in (every if every is not None else (yield from self._all(name)))
                if "lg" in e.metadata]

    def _cursor(self, name: str, cached: bool = False, recent: bool = False
                ) -> Step[tuple[Head, Cursor] | None]:
        """The head of a store thread and a cursor over its log (``cursor.py``): the head this
        process last wrote or read when ``cached``, else the stored one; None when the thread
        does not exist. ``recent``: over the packs that hold the head's newest entries and
        what they reach (``ObjectStore.view(newest=True)``: reading past them, into a history
        pack or a long thread's archive, raises ``InArchive``)."""
        known = self._core.known_ref(name) if cached else None
        if known is not None:
            head = known.head
        else:
            try:
                head = (yield from self._core.ref(name)).head
            except NotFoundError:
                return None
        return head, Cursor((yield from self._core.refs.newest_first(head, recent, recent)))

    def _find(self, name: str, lg: str) -> Step[LogEntry | None]:
        """The entry of LangGraph checkpoint ``lg``: in the head this process last wrote (no
        read), else in the stored head. Reads the entries since it (the log has ``lgm``
        bounds) or, for a thread written before them, the log back to it (the head's tail
        first: ``_ask``)."""
        for cached in (True, False):
            known = self._core.known_ref(name) if cached else None
            if known is not None:
                head = known.head
            elif cached:
                continue
            else:
                try:
                    head = (yield from self._core.ref(name)).head
                except NotFoundError:
                    return None
            found = yield from self._ask(head, lambda _, cursor: cursor.find(lg))
            if found is not None:
                return found
        return None

    def _names(self, thread_id: str | None = None) -> Step[list[tuple[str, str, str]]]:
        """(store name, thread_id, ns) of this saver's threads (of one thread_id)."""
        out = []
        for name in (yield from self._core.threads()):
            got = _parse(name)
            if got is not None and (thread_id is None or got[0] == thread_id):
                out.append((name, *got))
        return out

    def _commit(self, thread_id: str, name: str, parts: list[Part]
                ) -> Step[list[LogEntry | Exception]]:
        """A group of prepared saves of store thread ``name`` (of LangGraph thread
        ``thread_id``: telemetry's span names it) committed together (``commit.commit``, as
        ``Core.commit``): each part's log entry, or the error that refused it. (A put's answer
        needs only its entry's id, a put_writes' nothing: no ``CheckpointInfo`` is made.)"""
        done = yield from commit_parts(self._core, name, parts)
        out: list[LogEntry | Exception] = []
        for part in done:
            if part.entry is not None:
                out.append(part.entry)
            else:
                assert part.error is not None
                out.append(part.error)
        return out

    def _put_part(self, config: RunnableConfig, checkpoint: Checkpoint,
                  metadata: CheckpointMetadata, new_versions: ChannelVersions
                  ) -> Step[tuple[str, Part,
                                  Callable[[CheckpointInfo | LogEntry], RunnableConfig],
                                  Callable[[], Step[None]] | None]]:
        """A put, prepared (its parent found, its state encoded and split: nothing written):
        its store thread, its part for ``Core.commit``, what makes the put's answer of the
        commit's, and what to run after the commit (a shallow saver's prune, or None)."""
        thread_id, ns = _target(config)
        parent = get_checkpoint_id(config)
        name = _key(thread_id, ns)
        meta = {"lg": checkpoint["id"], "lgp": parent,
                "m": to_log(get_serializable_checkpoint_metadata(config, metadata))}
        parents: tuple[CheckpointId, ...] | None = None
        if parent is not None:  # LangGraph's parent, which need not be the head (time travel)
            found = yield from self._find(name, parent)
            parents = (found.id,) if found is not None else ()
        lg = str(checkpoint["id"])
        raising = self.conflicts == "raise"

        def stamp(head: Head) -> Step[dict[str, Any]]:
            """``lgm`` of the new entry, from the head it extends (inside the compare-and-swap:
            exact whatever other writers did): the newest checkpoint entry's ``lgm``, or for a
            thread written before ``lgm`` existed, the greatest id of its whole log (once)."""
            return (yield from self._ask(head, decide))

        def decide(head: Head, cursor: Cursor) -> dict[str, Any]:
            early = _early(cursor)
            newest = cursor.first_checkpoint()
            if raising and (None if newest is None else lg_of(newest)) != parent:
                raise ConflictError(name, parent, None if newest is None else lg_of(newest))
            top = None if newest is None else newest.metadata.get(MAX_KEY)
            anchor = early.pop(lg, None)
            if newest is not None and not isinstance(top, str):
                top = lg_of(cursor.latest() or newest)  # a log of before lgm: read it all,
                anchor = ""  # once; and its writes may be anywhere in it
            out: dict[str, Any] = {MAX_KEY: lg if top is None or lg > top else top}
            if anchor is not None:
                out[WRITES_FROM] = anchor
            if early:
                out[EARLY] = early
            return out

        state = self._encoder.state(thread_id, ns, checkpoint, new_versions, self._core.types)
        # Shallow: the save keeps the latest checkpoint alone, in its compare-and-swap; a graph
        # with DeltaChannels keeps the ancestors down to their snapshots (a prune after it).
        deltas = self.shallow and bool(metadata.get("counters_since_delta_snapshot"))
        part = self._core.prepare(state, metadata=meta, parents=parents, check=stamp,
                                  retain=shallow if self.shallow and not deltas else None)

        def finish(info: CheckpointInfo | LogEntry) -> RunnableConfig:
            self._encoder.saved(thread_id, ns, state, info.id)
            return _config(thread_id, ns, checkpoint["id"])

        def tidy() -> Step[None]:
            yield from self._prune([thread_id], "keep_latest", ns)

        return name, part, finish, tidy if deltas else None

    def _writes_part(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                     task_id: str, task_path: str) -> tuple[str, Part] | None:
        """A put_writes, prepared (nothing written): its store thread and its part for
        ``Core.commit``; None when there are no writes."""
        thread_id, ns = _target(config)
        cid = get_checkpoint_id(config)
        if cid is None:
            raise InvalidArgumentError("put_writes needs configurable.checkpoint_id")
        items = [[WRITES_IDX_MAP.get(channel, idx), channel, value]
                 for idx, (channel, value) in enumerate(writes)]
        if not items:
            return None
        state = {"task": task_id, "path": task_path, "writes": items}

        def stamp(head: Head) -> Step[dict[str, Any] | None]:
            """Carry the newest entry's ``lge`` on, with ``cid`` added when its checkpoint is
            not in the log yet (an early write: see ``cursor.py``)."""
            return (yield from self._ask(head, decide))

        def decide(head: Head, cursor: Cursor) -> dict[str, Any] | None:
            early = _early(cursor)
            if cid not in early and cursor.find(cid) is None:
                early[cid] = head.head or ""
                while len(early) > MAX_EARLY:
                    del early[next(iter(early))]
            return {EARLY: early} if early else None

        return _key(thread_id, ns), self._core.prepare(
            state, metadata={"w": cid, "task": task_id}, parents=(), check=stamp,
            retain=shallow if self.shallow else None)

    def _ask(self, head: Head, question: Callable[[Head, Cursor], T]) -> Step[T]:
        """``question``'s answer about ``head`` over a cursor on its log. A save's stamp
        mostly asks about the newest entries: it is asked over the head's tail first, and a
        view of the head's packs is made only when it reads past the tail (``Short``), to
        give the cursor the rest of the log and ask again (each entry read once)."""
        refs = self._core.refs
        if not head.peaks:
            return question(head, Cursor(refs.iter_tail(head)))
        cursor = Cursor(refs.iter_tail(head), short=True)
        try:
            return question(head, cursor)
        except Short:
            pass
        view = yield from refs.view(head)
        assert view is not None  # (a head with segments)
        cursor.more(refs.iter_segments(head, view))
        return question(head, cursor)

    def _writes(self, thread_id: str, ns: str, cids: set[str] | None,
                every: Sequence[CheckpointInfo | LogEntry] | None = None,
                head: Head | None = None, recent: bool = False
                ) -> Step[dict[str, list[PendingWrite]]]:
        """Pending writes per LangGraph checkpoint id (of ``cids``, or all), deduplicated as
        LangGraph's savers do and in ``writes_sort_key`` order (found in ``every``, the
        thread's entries newest first, when the caller read them already: a long log is read
        once; loaded from ``head`` when given, else from the stored ref)."""
        name = _key(thread_id, ns)
        entries = every if every is not None else (yield from self._all(name))
        wanted = [e for e in reversed(entries)
                  if "w" in e.metadata and (cids is None or str(e.metadata["w"]) in cids)]
        per: dict[str, dict[tuple[str, int], tuple[str, str, Any, str]]] = {}
        loaded = yield from self._load(name, head, [e.id for e in wanted], recent)
        for entry in wanted:  # oldest first
            state, target = loaded[entry.id], str(entry.metadata["w"])
            got = per.setdefault(target, {})
            for idx, channel, value in state["writes"]:
                key = (state["task"], idx)
                if idx >= 0 and key in got:
                    continue  # a regular write keeps its first value
                got[key] = (state["task"], channel, value, state["path"])
        return {cp: [(w[0], w[1], w[2]) for k, w in sorted(
            got.items(), key=lambda kv: writes_sort_key(kv[1][3], *kv[0]))]
            for cp, got in per.items()}

    def _load(self, name: str, head: Head | None, ids: list[CheckpointId], recent: bool = False
              ) -> Step[dict[CheckpointId, Any]]:
        """The states of these entries, from ``head`` (the one the caller read them in: no
        second read of the ref; ``recent``: from the packs of its newest entries), else from
        the stored ref; one ``head`` no longer holds (a merge and a gc since, or in a pack
        ``recent`` leaves out) is loaded from the stored ref."""
        if not ids:
            return {}
        if head is not None:
            try:
                view = yield from self._core.objects.view(head, recent, recent)
                return {i: self._core.decode(view, i, name).state for i in dict.fromkeys(ids)}
            except NotFoundError:
                pass
        got = yield from self._core.load_many(name, ids)
        return {i: cp.state for i, cp in got.items()}

    @staticmethod
    def _tuple(thread_id: str, ns: str, info: CheckpointInfo | LogEntry, state: Any,
               writes: list[PendingWrite], cursor: Cursor) -> CheckpointTuple:
        """LangGraph's tuple of a checkpoint; one whose parent is no longer among the
        namespace's checkpoints (prune, delete_for_runs: not found by ``cursor``) has no
        parent."""
        lg, parent = info.metadata["lg"], info.metadata.get("lgp")
        if parent is not None and cursor.find(str(parent)) is None:
            parent = None
        meta = cast(CheckpointMetadata, from_log(info.metadata["m"]))
        return CheckpointTuple(_config(thread_id, ns, lg), state, meta,
                               _config(thread_id, ns, parent) if parent else None, writes)

    def _get_tuple(self, config: RunnableConfig) -> Step[CheckpointTuple | None]:
        """The latest checkpoint (or the one ``checkpoint_id`` names) and its pending writes:
        the entries from the head back to it (``cursor.py``), its parent's entry, one load.
        Read from the packs of the head's newest entries (its live and newest packs); from
        its history and archive too only when they do not hold it (an old checkpoint: one
        more round on object storage)."""
        try:
            return (yield from self._get_tuple_in(config, recent=True))
        except InArchive:
            return (yield from self._get_tuple_in(config, recent=False))

    def _get_tuple_in(self, config: RunnableConfig, recent: bool
                      ) -> Step[CheckpointTuple | None]:
        thread_id, ns = _target(config)
        cid = get_checkpoint_id(config)
        name = _key(thread_id, ns)
        try:
            ref = yield from self._core.ref(name)
        except NotFoundError:
            return None

        def read(ref: Ref) -> Step[CheckpointTuple | None]:  # (again on a newer ref when a
            return (yield from self._tuple_at(thread_id, ns, cid, ref.head, recent))  # pack

        return (yield from self._core.at_ref(name, read, ref))  # went)

    def _tuple_at(self, thread_id: str, ns: str, cid: str | None, head: Head, recent: bool
                  ) -> Step[CheckpointTuple | None]:
        name = _key(thread_id, ns)
        cursor = Cursor((yield from self._core.refs.newest_first(head, recent, recent)))
        info = cursor.latest() if cid is None else cursor.find(cid)
        if info is None:
            return None
        lg = str(info.metadata["lg"])
        cursor.reach([info])
        writes = yield from self._writes(thread_id, ns, {lg}, cursor.writes({lg}), head, recent)
        loaded = yield from self._load(name, head, [info.id], recent)
        self._encoder.loaded(thread_id, ns, info.id, loaded[info.id])
        return self._tuple(thread_id, ns, info, loaded[info.id], writes.get(lg, []), cursor)

    def _list(self, config: RunnableConfig | None, filter: dict[str, Any] | None,
              before: RunnableConfig | None, limit: int | None) -> Step[list[CheckpointTuple]]:
        """Checkpoints, greatest id first per namespace; with ``limit``, a namespace's log is
        read back only as far as its ``limit`` greatest ids (``Cursor.top``)."""
        conf = (config or {}).get("configurable") or {}
        want_thread = conf.get("thread_id")
        want_ns = conf.get("checkpoint_ns")
        want_id = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        out: list[CheckpointTuple] = []
        if want_thread is not None and want_ns is not None:  # one namespace: no listing
            names = [(_key(str(want_thread), str(want_ns)), str(want_thread), str(want_ns))]
        else:
            names = yield from self._names(None if want_thread is None else str(want_thread))

        def accept(entry: LogEntry, lg: str) -> bool:
            if (want_id and lg != want_id) or (before_id and lg >= before_id):
                return False
            meta = from_log(entry.metadata.get("m") or {})
            return not filter or all(meta.get(k) == v for k, v in filter.items())

        for _name, thread_id, ns in sorted(names, key=lambda n: (n[1], n[2])):
            if want_ns is not None and ns != want_ns:
                continue
            name = _key(thread_id, ns)
            try:
                ref = yield from self._core.ref(name)
            except NotFoundError:
                continue
            left = None if limit is None else limit - len(out)

            def read(ref: Ref, thread_id: str = thread_id, ns: str = ns,
                     left: int | None = left) -> Step[list[CheckpointTuple]]:
                return (yield from self._tuples_at(thread_id, ns, ref.head, left, want_id,
                                                   accept))

            out += yield from self._core.at_ref(name, read, ref)  # (again on a newer ref
            if limit is not None and len(out) >= limit:  # when a pack went meanwhile)
                break
        return out

    def _tuples_at(self, thread_id: str, ns: str, head: Head, left: int | None,
                   want_id: str | None, accept: Callable[[LogEntry, str], bool]
                   ) -> Step[list[CheckpointTuple]]:
        """``_list``'s answer from one namespace's head: its ``left`` greatest ids (or
        ``want_id``) that ``accept`` takes."""
        cursor = Cursor((yield from self._core.refs.newest_first(head)))
        if want_id:
            found = cursor.find(want_id)
            chosen = [found] if found is not None and accept(found, want_id) else []
        else:
            chosen = cursor.top(left, accept)
        if not chosen:
            return []
        lgs = {str(i.metadata["lg"]) for i in chosen}
        cursor.reach(chosen)
        writes = yield from self._writes(thread_id, ns, lgs, cursor.writes(lgs), head)
        loaded = yield from self._load(_key(thread_id, ns), head, [i.id for i in chosen])
        return [self._tuple(thread_id, ns, info, loaded[info.id],
                            writes.get(str(info.metadata["lg"]), []), cursor)
                for info in chosen]
