"""The store's operations, once: every operation of ``CheckpointStore`` and
``AsyncCheckpointStore`` as a step that yields its storage requests; the faces only drive them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import islice
from typing import Any, TypeVar

from cas_checkpoint.backends import Backend
from cas_checkpoint.engine import commit as group
from cas_checkpoint.engine import locate, model, retention, seek, settings
from cas_checkpoint.engine.archive import InArchive
from cas_checkpoint.engine.caches import Known, Remembered, Threads
from cas_checkpoint.engine.locate import LOAD_RETRIES
from cas_checkpoint.engine.model import UNSET, Checkpoint, CheckpointInfo, Unset, check_id, info_of
from cas_checkpoint.engine.object_store import ObjectStore, View
from cas_checkpoint.engine.refs import Change, Ref, RefStore, build, new_lineage, thread_key
from cas_checkpoint.engine.steps import ReadRefs, Step
from cas_checkpoint.engine.turns import ThreadLocks
from cas_checkpoint.errors import (
    FormatError,
    IntegrityError,
    InvalidArgumentError,
    NotFoundError,
    StorageError,
)
from cas_checkpoint.format import codec
from cas_checkpoint.format.codec import TypeRegistry
from cas_checkpoint.format.heads import Head, named
from cas_checkpoint.format.objects import (
    CheckpointId,
    LogEntry,
    ObjectId,
    Record,
)
from cas_checkpoint.tree import build as tree

log = logging.getLogger("cas_checkpoint")
log.addHandler(logging.NullHandler())

CACHE_BYTES = 256 * 1024 * 1024  # packs kept in memory per store object, at most (pack_cache.py)
_T = TypeVar("_T")


class Core:
    """What a store object holds, and its operations as steps."""

    def __init__(self, backend: Backend, types: Iterable[type] | TypeRegistry,
                 keep_last: int | None = None,
                 cache_dir: str | Any | None = None, cache_bytes: int = CACHE_BYTES,
                 keep_mode: str = "batch") -> None:
        if keep_last is not None:
            retention.check_policy(keep_last, None)
        self.keep_mode = retention.check_mode(keep_mode)
        if not isinstance(cache_bytes, int) or isinstance(cache_bytes, bool) or cache_bytes < 0:
            raise InvalidArgumentError(f"cache_bytes must be a non-negative int, not "
                                       f"{cache_bytes!r}")
        self.keep_last = keep_last
        self.backend = backend
        folder = None if cache_dir is None else str(cache_dir)
        try:
            self.objects = ObjectStore(backend, cache_bytes, folder)
        except OSError as exc:
            raise StorageError(f"cannot use cache_dir {folder!r}: {exc}") from exc
        self.refs = RefStore(backend, self.objects)
        self.types = types if isinstance(types, TypeRegistry) else TypeRegistry(types)
        # per thread (bounded): the last ref this store object wrote or loaded (``_known``),
        # and the objects known held by that thread's lineage (``_have``); read directly,
        # changed through ``_threads``
        self._threads = Threads()
        self._known, self._have = self._threads.refs, self._threads.have
        self._memo = tree.Memo()  # what recent saves hashed (content-keyed: never stale)
        self._memo_lock = threading.Lock()
        self._warm = Remembered(self.objects.shared)  # states, newest heads (caches.py)
        self.turns = ThreadLocks()  # the sync faces' saves to one thread take turns (turns.py)

    @property
    def url(self) -> str:
        return self.backend.url

    # --- writing ---

    def save(self, thread_id: str, state: Any, *, label: str | None = None,
             tags: Iterable[str] = (), metadata: dict[str, Any] | None = None,
             expected_head: CheckpointId | None | Unset = UNSET,
             parents: Iterable[CheckpointId] | None = None,
             check: Callable[[Head], Step[dict[str, Any] | None]] | None = None,
             status: str | None = None,
             kind: str | None = None, reason: str | None = None,
             keep_last: int | None | Unset = UNSET,
             retain: retention.Retain | None = None) -> Step[CheckpointInfo]:
        """(``check(head)``, if given, runs inside the compare-and-swap on the head the save
        would extend, and may raise to refuse it: a condition on more than the head's id. What
        it returns is added to ``metadata``, checked as metadata is: facts about the log the
        entry extends, exact whatever other writers did. ``keep_last`` (this save only: exact)
        or the store's ``keep_last`` (exact or in batches, by ``keep_mode``) and ``retain``
        (entries -> the entries to keep, for an integration) drop checkpoints from the log in
        the same compare-and-swap.)"""
        t0 = time.perf_counter()
        thread_key(thread_id)
        part = group.prepare(self, state, label=label, tags=tags, metadata=metadata,
                              parents=parents, check=check, status=status, kind=kind,
                              reason=reason, keep_last=keep_last, retain=retain)
        got = (yield from self.commit(thread_id, [part], expected_head=expected_head))[0]
        if isinstance(got, Exception):
            raise got
        log.debug("save thread=%r id=%s bytes=%d in %.1f ms", thread_id, got.id, got.size,
                  (time.perf_counter() - t0) * 1000)
        return got

    def prepare(self, state: Any, **kw: Any) -> group.Part:
        """A save checked and its state split into nodes, ready for ``commit`` (arguments as
        ``save``'s; nothing is written)."""
        return group.prepare(self, state, **kw)

    def commit(self, thread_id: str, parts: list[group.Part],
               expected_head: CheckpointId | None | Unset = UNSET
               ) -> Step[list[CheckpointInfo | Exception]]:
        """Prepared saves of one thread, appended in order in one compare-and-swap (a group
        commit, ``commit.py``): each part's ``CheckpointInfo``, or the error that refused it
        (the others landed)."""
        done = yield from group.commit(self, thread_id, parts, expected_head)
        return group.infos(thread_id, done)

    # --- reading ---

    def with_types(self, types: TypeRegistry) -> Core:
        """Another engine over the same storage and settings, storing the classes of ``types``
        (caches of its own; no ``keep_last``): for an integration that drives these steps as
        a third face (CasSaver)."""
        core = Core(self.backend, types, None)  # (an integration retains by ``retain``)
        core.objects.wanted = self.objects.wanted  # the store's compression
        return core

    def known_ref(self, thread_id: str) -> Ref | None:
        """The ref of ``thread_id`` this object last wrote or read (None: none remembered)."""
        return self._known.get(thread_id)

    def forget_thread(self, thread_id: str, ref_only: bool = False) -> None:
        """Drop what this object remembers of ``thread_id`` (its ref only, with ``ref_only``):
        maintenance changed the thread's ref or packs."""
        self._threads.forget(thread_id, ref_only=ref_only)

    def ref(self, thread_id: str) -> Step[Ref]:
        ref = yield from self.refs.read(thread_id)
        if ref is None or ref.head.head is None:
            if self.objects.keyring is None and self.objects.settings is None:
                # an encrypted store opened without its key? (not once this object wrote: its
                # first write read the settings and refused that; a CasSaver's new namespace
                # is a missing thread every turn)
                yield from settings.refuse_encrypted(self.url)
            raise NotFoundError(f"thread {thread_id!r} does not exist in {self.url}; "
                                "threads() lists the threads there are")
        return ref

    @staticmethod
    def _not_in(thread_id: str, cid: str) -> NotFoundError:
        return NotFoundError(
            f"checkpoint {cid} is not in thread {thread_id!r}; history({thread_id!r}) lists its "
            "checkpoints, and get(id) loads a checkpoint of any thread"
        )

    def _entry(self, thread_id: str, head: Head, view: View | None,
               cid: CheckpointId) -> LogEntry:
        """The log entry of ``cid``: found by its record's step in O(log n) segments
        (``seek.py``), else by walking the log from its newest entry (which says what is
        wrong with a log the search cannot read)."""
        step = None if view is None else seek.step_of(view, cid)
        if step is not None:
            found = seek.find(head, view, cid, step)
            if found is not None:
                return found
        for entry in self.refs.iter_newest_first(head, view):
            if entry.id == cid:
                return entry
        raise self._not_in(thread_id, cid)

    def load(self, thread_id: str, checkpoint_id: CheckpointId | None = None
             ) -> Step[Checkpoint]:
        t0 = time.perf_counter()
        cid = None if checkpoint_id is None else check_id(checkpoint_id)

        def read(ref: Ref) -> Step[Checkpoint]:
            warm = None if cid is not None else self._warm.warm(thread_id, ref.head)
            if warm is not None:  # the head this store object saved or loaded: from memory
                assert ref.head.head is not None
                return model.checkpoint_of(ref.head.head, thread_id, warm[0],
                                           codec.decode(warm[1], types=self.types))
            got: Checkpoint = yield from self.load_ref(thread_id, ref, cid)
            return got

        cp = yield from self.at_ref(thread_id, read)
        log.debug("load thread=%r id=%s bytes=%d in %.1f ms", thread_id, cp.id, cp.size,
                  (time.perf_counter() - t0) * 1000)
        return cp

    def at_ref(self, thread_id: str, read: Callable[[Ref], Step[_T]],
               first: Ref | None = None) -> Step[_T]:
        """``read(ref)`` of the thread's ref (``first``, when the caller has it), read again
        and retried when something it names is gone and the ref moved meanwhile: a pack a
        writer's merge replaced and then deleted (``collect.py``), or a repack and a gc. A
        reader of an old head thus gets its data, or a newer state. Only a ref that still
        names what is missing says the thread is damaged (NotFoundError)."""
        ref = first
        for attempt in range(LOAD_RETRIES):
            if ref is None:
                ref = yield from self.ref(thread_id)
            try:
                return (yield from read(ref))
            except InArchive:  # (not gone: the caller reads the head's archive next)
                raise
            except NotFoundError:
                latest = yield from self.refs.read(thread_id)
                if latest is not None and latest.version == ref.version:
                    raise
                if latest is None:  # deleted meanwhile: says that the thread does not exist
                    yield from self.ref(thread_id)
                log.debug("thread %r moved while a read fetched what its ref named (attempt "
                          "%d); reading it again", thread_id, attempt + 1)
                if attempt + 1 == LOAD_RETRIES:
                    raise StorageError(
                        f"thread {thread_id!r} moved {LOAD_RETRIES} times while a read of it "
                        "fetched what each ref read named (its writer's merges, or a repack and "
                        "a gc, replaced it; nothing is damaged); read it again"
                    ) from None
                ref = None
        raise AssertionError("unreachable")  # pragma: no cover

    def load_ref(self, thread_id: str, ref: Ref, checkpoint_id: CheckpointId | None
                  ) -> Step[Checkpoint]:
        head = ref.head
        cid = head.head if checkpoint_id is None else checkpoint_id
        assert cid is not None
        # the newest state is in the head's own packs (a long thread's archive: only if not)
        view: View = yield from self.objects.view(head, recent=cid == head.head)
        try:
            return self._load_view(thread_id, ref, checkpoint_id, cid, view)
        except InArchive:
            view = yield from self.objects.view(head)
            return self._load_view(thread_id, ref, checkpoint_id, cid, view)

    def _load_view(self, thread_id: str, ref: Ref, checkpoint_id: CheckpointId | None,
                   cid: CheckpointId, view: View) -> Checkpoint:
        head = ref.head
        if checkpoint_id is not None and cid != head.head:
            self._entry(thread_id, head, view, cid)
        elif all(e.id != cid for e in head.tail):  # a head edited to point outside its log
            try:
                self._entry(thread_id, head, view, cid)
            except (IntegrityError, FormatError) as exc:  # the log is damaged, the head is not
                log.warning("thread %r: cannot check its head against its log: %s", thread_id,
                            exc)
            except NotFoundError as exc:
                if isinstance(exc, InArchive) or "is not in thread" in str(exc):
                    raise
                log.warning("thread %r: cannot check its head against its log: %s", thread_id,
                            exc)
        cp = self.decode(view, cid, thread_id, newest=cid == head.head)
        if cid == head.head:  # a save that follows this load need not write what it holds
            self._threads.remember(thread_id, ref, Known(head.lineage, view))
        return cp

    def load_many(self, thread_id: str, cids: Iterable[CheckpointId]
                  ) -> Step[dict[CheckpointId, Checkpoint]]:
        """Checkpoints the caller just listed from the thread's history, decoded from one read
        of its ref and packs (``load`` checks each id against the log: a walk per call). One
        the head no longer holds (a retain and repack since) is loaded with ``load``."""
        wanted = list(dict.fromkeys(cids))
        if not wanted:
            return {}
        def read(ref: Ref) -> Step[View]:
            got: View = yield from self.objects.view(ref.head)
            return got

        view = yield from self.at_ref(thread_id, read)
        out: dict[CheckpointId, Checkpoint] = {}
        for cid in wanted:
            try:
                out[cid] = self.decode(view, cid, thread_id)
            except NotFoundError:
                out[cid] = yield from self.load(thread_id, cid)
        return out

    def get(self, checkpoint_id: CheckpointId) -> Step[Checkpoint]:
        cid = check_id(checkpoint_id)

        def read(refs: locate.Refs) -> Step[Checkpoint]:
            view = (yield from locate.locate(self, [cid], refs))[cid]
            return self.decode(view, cid, None)

        return (yield from locate.across_refs(self, read))

    def all_refs(self) -> Step[list[tuple[str, Ref | None]]]:
        """Every thread and its ref (read concurrently)."""
        threads = yield from self.refs.threads()
        keys = [thread_key(t) for t in threads]
        got = yield ReadRefs(keys)
        return [(t, self.refs.decode(t, k, g)) for t, k, g in zip(threads, keys, got,
                                                                  strict=True)]

    def decode(self, view: View, cid: CheckpointId, thread_id: str | None, *,
               newest: bool = False) -> Checkpoint:
        """The checkpoint ``cid`` from the objects of ``view`` (pure: the view holds them);
        ``newest``: it is the head's, loaded with every check (warm loads may reuse it, and
        keep its state's encoding for the next)."""
        try:
            record = Record.decode(view.get(cid))
        except NotFoundError as exc:
            if view.unreadable or isinstance(exc, InArchive):  # (the error names the pack it
                raise  # may be in; or the archive that the reader reads next)
            raise NotFoundError(f"checkpoint {cid} does not exist in {self.url}") from None
        if newest:  # the head's checkpoint, after every check load makes: for warm loads
            self._warm.newest(view.head.thread_id, view.head, record)
        cached = self._warm.encoding(record.root, view)
        if cached is not None:
            return model.checkpoint_of(cid, thread_id, record,
                                       codec.decode(cached, types=self.types))
        state = tree.load(record.root, view.fetch(record.root, record.root_node), self.types,
                          max_bytes=2 * record.size + (1 << 20))
        if newest:
            self._warm.loaded(view.head.thread_id, record.root, record.size, state,
                              self.types)
        return model.checkpoint_of(cid, thread_id, record, state)

    def history(self, thread_id: str, *, limit: int | None = None,
                before: CheckpointId | None = None, cached: bool = False,
                kind: str | Iterable[str] | None = None,
                status: str | Iterable[str] | None = None) -> Step[list[CheckpointInfo]]:
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                                  or limit < 0):
            raise InvalidArgumentError("limit must be a non-negative int or None")
        if before is not None:
            before = check_id(before, "before")
        wanted = model.entry_filter(kind, status)
        known = self._known.get(thread_id) if cached else None  # (a log only ever grows at
        # its end)

        def read(ref: Ref) -> Step[list[CheckpointInfo]]:
            head = ref.head
            out: list[CheckpointInfo] = []
            skipping = before is not None

            def take(entries: Iterator[LogEntry]) -> bool:  # True: enough
                nonlocal skipping
                for entry in entries:
                    if limit is not None and len(out) >= limit:
                        return True
                    if skipping:
                        skipping = entry.id != before
                        continue
                    if wanted(entry):
                        out.append(info_of(entry, thread_id))
                return limit is not None and len(out) >= limit

            if before is not None and head.peaks and all(e.id != before for e in head.tail):
                for recent in (True, False):  # the entries older than ``before``, from its leaf
                    at = yield from self.objects.view(head, recent)  # on (seek.py)
                    try:
                        step = seek.step_of(at, before)
                        older = None if step is None else seek.older(head, at, before, step)
                        if older is None:
                            break
                        skipping = False
                        take(older)
                        return out
                    except InArchive:  # (in the archive: read it too)
                        del out[:]
                        skipping = True
                    except seek.Unseekable:  # a log the search cannot read: walk it
                        del out[:]
                        skipping = True
                        break
            if not take(reversed(head.tail)) and head.peaks:  # past the tail: read the packs
                view = yield from self.refs.view(head, recent=True)  # (the newest entries)
                done, skipped = len(out), skipping
                try:
                    take(islice(self.refs.iter_newest_first(head, view), len(head.tail), None))
                except InArchive:  # older entries, in a long thread's archive: read it too
                    del out[done:]
                    skipping = skipped
                    view = yield from self.refs.view(head)
                    take(islice(self.refs.iter_newest_first(head, view), len(head.tail), None))
            if skipping:
                raise NotFoundError(f"checkpoint {before} is not in thread {thread_id!r}")
            return out

        return (yield from self.at_ref(thread_id, read, known))

    def find(self, thread_id: str, *, label: str | None = None, tag: str | None = None,
             metadata: Mapping[str, Any] | None = None, status: str | Iterable[str] | None = None,
             kind: str | Iterable[str] | None = None) -> Step[list[CheckpointInfo]]:
        wanted = model.entry_filter(kind, status)

        def read(ref: Ref) -> Step[list[CheckpointInfo]]:
            out = []
            for entry in (yield from self.refs.newest_first(ref.head)):
                if label is not None and entry.label != label:
                    continue
                if tag is not None and tag not in entry.tags:
                    continue
                if metadata and any(entry.metadata.get(k, UNSET) != v
                                    for k, v in metadata.items()):
                    continue
                if not wanted(entry):
                    continue
                out.append(info_of(entry, thread_id))
            return out

        return (yield from self.at_ref(thread_id, read))

    def threads(self) -> Step[list[str]]:
        return (yield from self.refs.threads())

    def count(self, thread_id: str) -> Step[int]:
        return (yield from self.ref(thread_id)).head.count

    def head(self, thread_id: str) -> Step[CheckpointId | None]:
        ref = yield from self.refs.read(thread_id)
        return ref.head.head if ref else None

    # --- history edits (they change refs only; gc reclaims the objects) ---

    def fork(self, thread_id: str, checkpoint_id: CheckpointId,
             new_thread_id: str) -> Step[CheckpointInfo]:
        cid = check_id(checkpoint_id)
        thread_key(new_thread_id)
        src = (yield from self.ref(thread_id)).head
        view: View = yield from self.objects.view(src)
        entries = self.refs.log_entries(src, view)
        by_id = {e.id: e for e in entries}
        if cid not in by_id:
            raise self._not_in(thread_id, cid)
        # Everything is checked before the new ref exists: the fork's head checkpoint must be
        # readable (its record and every node of its state: a damaged pack raises here).
        view.check_checkpoint(cid)
        keep: set[str] = set()
        todo = [cid]
        while todo:
            c = todo.pop()
            if c in by_id and c not in keep:
                keep.add(c)
                todo.extend(by_id[c].parents)
        kept = [e for e in entries if e.id in keep]
        if (yield from self.refs.read(new_thread_id)) is not None:
            raise InvalidArgumentError(f"thread {new_thread_id!r} already exists; delete it or "
                                       "fork into another name")
        # the packs the fork will name, marked held in the source (its writers never delete
        # them: collect.py); when the source moved meanwhile, its newer head holds the same
        held = (yield from self.refs.hold(thread_id)).head
        if held.packs != src.packs or held.archive != src.archive:
            src = held
            view = yield from self.objects.view(src)
            view.check_checkpoint(cid)

        def change(ref: Ref | None) -> Step[tuple[Head | None, dict[ObjectId, bytes]]]:
            new: dict[ObjectId, bytes] = {}
            base = Head(new_thread_id, None, packs=src.packs, inline=src.inline,
                        lineage=new_lineage(), archive=src.archive, held=named(src))
            head = build(base, kept, cid, new)
            return head, (yield from self.refs.missing(src, new))

        ref = yield from self.refs.update(new_thread_id, change, expected_head=None,
                                          current=None)
        if ref is not None:  # the fork holds what its source held: a save need not resend it
            self._threads.remember(new_thread_id, ref, Known(ref.head.lineage, view))
        log.info("fork %r at %s into %r", thread_id, cid, new_thread_id)
        return info_of(by_id[cid], new_thread_id)

    def copy(self, thread_id: str, new_thread_id: str) -> Step[Ref]:
        """``new_thread_id`` holding exactly what ``thread_id`` holds (every checkpoint, its head,
        its packs): no state is copied. The new thread must not exist."""
        thread_key(new_thread_id)
        yield from self.ref(thread_id)
        src = (yield from self.refs.hold(thread_id)).head  # (its packs held: collect.py)

        def change(ref: Ref | None) -> Step[tuple[Head | None, dict[ObjectId, bytes]]]:
            if ref is not None:
                raise InvalidArgumentError(f"thread {new_thread_id!r} already exists; delete it "
                                           "or copy into another name")
            return Head(new_thread_id, src.head, src.head_step, src.peaks, src.tail, src.packs,
                        src.inline, new_lineage(), src.archive, named(src)), {}
            yield  # pragma: no cover - a step

        ref = yield from self.refs.update(new_thread_id, change, expected_head=None,
                                          current=None)
        assert ref is not None
        log.info("copy %r into %r", thread_id, new_thread_id)
        return ref

    def rewind(self, thread_id: str, checkpoint_id: CheckpointId, *,
               expected_head: CheckpointId | None | Unset = UNSET) -> Step[CheckpointInfo]:
        cid = check_id(checkpoint_id)
        found: dict[str, LogEntry] = {}

        def change(ref: Ref | None) -> Step[tuple[Head | None, dict[ObjectId, bytes]]]:
            if ref is None or ref.head.head is None:
                raise NotFoundError(f"thread {thread_id!r} does not exist")
            entries = yield from self.refs.entries(ref.head)
            ids = [e.id for e in entries]
            if cid not in ids:
                raise self._not_in(thread_id, cid)
            kept = entries[: ids.index(cid) + 1]
            found["entry"] = kept[-1]
            return (yield from self.refs.rebuilt(ref.head, kept, cid))

        yield from self._edit(thread_id, change, expected_head=expected_head)
        log.info("rewind %r to %s", thread_id, cid)
        return info_of(found["entry"], thread_id)

    def forget(self, thread_id: str) -> None:
        """Drop what this store object remembers of a thread's ref (before a module outside
        this one, such as an import, changes the ref)."""
        self._threads.forget(thread_id)
        self._warm.forget(thread_id)

    def _edit(self, thread_id: str, change: Change,
              expected_head: CheckpointId | None | Unset = UNSET) -> Step[None]:
        """A history edit of an existing thread, by compare-and-swap."""
        self._threads.forget(thread_id, ref_only=True)
        current = yield from self.ref(thread_id)
        yield from self.refs.update(thread_id, change, expected_head=expected_head,
                                    current=current)

    def delete(self, thread_id: str, *checkpoint_ids: CheckpointId,
               expected_head: CheckpointId | None | Unset = UNSET) -> Step[None]:
        ids = retention.check_ids(checkpoint_ids)
        yield from self._edit(thread_id, retention.removal(self.refs, thread_id, ids),
                              expected_head=expected_head)
        log.info("delete %s from %r", ", ".join(sorted(ids)), thread_id)

    def retain(self, thread_id: str, keep: set[CheckpointId]) -> Step[None]:
        """Keep only these checkpoints in the thread's log (the head moves to the newest kept
        one if it goes); refs only, by compare-and-swap."""
        def change(ref: Ref | None) -> Step[tuple[Head | None, dict[ObjectId, bytes]]]:
            if ref is None or ref.head.head is None:
                raise NotFoundError(f"thread {thread_id!r} does not exist")
            kept = [e for e in (yield from self.refs.entries(ref.head)) if e.id in keep]
            if not kept:
                return None, {}
            head_id = ref.head.head if ref.head.head in keep else kept[-1].id
            return (yield from self.refs.rebuilt(ref.head, kept, head_id))

        yield from self._edit(thread_id, change)

    def delete_thread(self, thread_id: str) -> Step[None]:
        def change(ref: Ref | None) -> Step[tuple[Head | None, dict[ObjectId, bytes]]]:
            return None, {}
            yield  # pragma: no cover - a step

        yield from self._edit(thread_id, change)
        log.info("delete thread %r", thread_id)
