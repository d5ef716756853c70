"""``CheckpointStore``: the public face of cas_checkpoint."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgpack

from . import codec, tree
from . import gc as gcmod
from . import repack as repackmod
from .backends import Backend, backend_for, open_backend
from .codec import TypeRegistry
from .errors import (
    FormatError,
    IntegrityError,
    InvalidArgumentError,
    NotFoundError,
    SerializationError,
    StorageError,
)
from .objects import (
    MAX_META_BYTES,
    CheckpointId,
    Head,
    LogEntry,
    ObjectId,
    Record,
    inlinable,
    is_object_id,
    object_id,
)
from .objstore import ObjectStore, View
from .refs import Ref, RefStore, build, new_lineage, thread_key
from .refs import append as log_append
from .repack import RepackReport
from .verify import Progress, VerifyReport
from .verify import verify as _verify

log = logging.getLogger("cas_checkpoint")
log.addHandler(logging.NullHandler())

_UNSET: Any = ...
CACHE_BYTES = 256 * 1024 * 1024  # packs kept in memory per store object (LRU)
STATE_CACHE_BYTES = 64 * 1024 * 1024  # encodings of recently saved states, for warm loads
LOAD_RETRIES = 3  # a load whose packs a merge and a gc removed meanwhile re-reads the ref


class _Known:
    """Ids of the objects this process saw in a head of one lineage (so a save may skip writing
    them): those of a view it loaded (hashed the first time a save asks), plus the ones it saved
    since."""

    __slots__ = ("ids", "lineage", "view")

    def __init__(self, lineage: bytes, view: View | None = None) -> None:
        self.lineage, self.view, self.ids = lineage, view, set[str]()

    def missing(self, nodes: dict[ObjectId, bytes]) -> dict[ObjectId, bytes]:
        base = self.view.frozen_ids() if self.view is not None else frozenset()
        return {k: nodes[k] for k in nodes.keys() - base - self.ids}


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """What history/find return: everything about a checkpoint but its state."""

    id: CheckpointId
    thread_id: str
    step: int
    parent_ids: tuple[CheckpointId, ...]
    created_at: datetime
    size: int  # encoded state bytes
    label: str | None = None
    tags: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Checkpoint(CheckpointInfo):
    """A loaded checkpoint: its info and its state."""

    state: Any = None


def _info(entry: LogEntry, thread_id: str) -> CheckpointInfo:
    return CheckpointInfo(entry.id, thread_id, entry.step, entry.parents,
                          datetime.fromtimestamp(entry.created_at, UTC), entry.size,
                          entry.label, entry.tags, entry.metadata)


def _check_id(cid: object, what: str = "checkpoint id") -> CheckpointId:
    if not is_object_id(cid):
        raise InvalidArgumentError(
            f"{what} {cid!r} is not a checkpoint id (64 lowercase hex digits, as returned by "
            "save() or history())"
        )
    return CheckpointId(str(cid))


def _check_meta(label: object, tags: object, metadata: object) -> tuple[str | None, tuple[str, ...],
                                                                        dict[str, Any]]:
    if label is not None and not isinstance(label, str):
        raise InvalidArgumentError(f"label must be a str or None, not {type(label).__name__}")
    if isinstance(tags, str) or not isinstance(tags, Iterable):
        raise InvalidArgumentError("tags must be a list of strings, e.g. tags=['tool']")
    tags = tuple(tags)
    if not all(isinstance(t, str) for t in tags):
        raise InvalidArgumentError("every tag must be a str")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) for k in metadata):
        raise InvalidArgumentError("metadata must be a dict with str keys")
    try:
        packed = msgpack.packb(metadata, strict_types=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SerializationError(
            f"metadata must hold JSON-like values (str, int, float, bool, None, list, dict): "
            f"{exc}; put richer values in the state instead", "metadata") from None
    if len(packed) > MAX_META_BYTES:
        raise InvalidArgumentError(
            f"metadata is {len(packed)} bytes encoded, more than {MAX_META_BYTES}; it is copied "
            "into the thread's log, so keep it small and put large values in the state"
        )
    return label, tags, metadata


@dataclass(frozen=True, slots=True)
class StoreStats:
    """What ``stats()`` reports."""

    threads: int
    checkpoints: int  # distinct checkpoints over all threads
    logical_bytes: int  # sum of their encoded state sizes
    physical_bytes: int  # bytes stored: packs and refs
    objects: int  # packs stored (each holds many objects)
    dedup_ratio: float  # logical / physical
    cache_hits: int = 0  # packs this store object found in its caches (memory, cache_dir)
    cache_misses: int = 0  # packs it had to read from storage


class CheckpointStore:
    """Checkpoints of agent state in a content-addressed object store.

    Open one with :meth:`open` (a directory path, ``memory://name``, ``s3://bucket/prefix``) or
    build it from an fsspec filesystem and a root: ``CheckpointStore(fs, "bucket/prefix")``.
    """

    def __init__(self, fs: Any, root: str, *, types: Iterable[type] = (),
                 allow_unsafe: bool = False, keep_last: int | None = None,
                 cache_dir: str | None = None, cache_bytes: int = CACHE_BYTES) -> None:
        self._init(backend_for(fs, root, allow_unsafe=allow_unsafe), types, keep_last,
                   cache_dir, cache_bytes)

    @classmethod
    def open(cls, url: str | Any, *, storage_options: Mapping[str, Any] | None = None,
             types: Iterable[type] = (), allow_unsafe: bool = False,
             keep_last: int | None = None, cache_dir: str | Any | None = None,
             cache_bytes: int = CACHE_BYTES, retries: int | None = None,
             timeout: float | None = None) -> CheckpointStore:
        """Open (creating if needed) the store at ``url``. ``types`` lists the dataclasses,
        pydantic models and enums that states may hold; nothing else is ever constructed.
        ``keep_last=N`` prunes each thread as it is saved to, keeping its last N checkpoints
        (and labelled/tagged ones); off by default, so no history is dropped unasked.
        Packs read are kept in memory (``cache_bytes``, LRU) and, with ``cache_dir``, in that
        local folder too (for S3 stores: a new process then reads its packs from disk). Packs
        are immutable and re-hashed when read back, so neither cache can go stale.
        Object storage: ``retries`` bounds this library's attempts at a failing request (6 by
        default; throttling and 5xx wait with exponential backoff, up to 2 s apart; an
        endpoint that never answered is not retried: a wrong URL fails in seconds), and
        ``timeout`` sets the connect and read timeouts, in seconds."""
        if retries is not None and (not isinstance(retries, int) or isinstance(retries, bool)
                                    or not 1 <= retries <= 100):
            raise InvalidArgumentError(f"retries must be an int from 1 to 100, not {retries!r}")
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, int | float) or timeout <= 0):
            raise InvalidArgumentError(f"timeout must be a positive number of seconds, not "
                                       f"{timeout!r}")
        store = cls.__new__(cls)
        url = str(url) if hasattr(url, "__fspath__") else url
        store._init(open_backend(url, dict(storage_options or {}), allow_unsafe=allow_unsafe,
                                 retries=retries, timeout=timeout),
                    types, keep_last, cache_dir, cache_bytes)
        return store

    def _init(self, backend: Backend, types: Iterable[type], keep_last: int | None = None,
              cache_dir: str | Any | None = None, cache_bytes: int = CACHE_BYTES) -> None:
        if keep_last is not None:
            gcmod.check_policy(keep_last, None)
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
        self._known: dict[str, Ref] = {}  # last ref this store wrote or loaded, per thread
        self._have: dict[str, _Known] = {}  # objects known held by that thread's lineage
        self._memo = tree.Memo()  # what recent saves hashed (content-keyed: never stale)
        self._memo_lock = threading.Lock()
        # state root -> the state's whole encoding, for states this process saved or loaded
        self._states: OrderedDict[str, bytes] = OrderedDict()
        self._states_bytes = 0

    @property
    def url(self) -> str:
        return self.backend.url

    def __repr__(self) -> str:
        return f"CheckpointStore({self.url!r})"

    # --- writing ---

    def save(self, thread_id: str, state: Any, *, label: str | None = None,
             tags: Iterable[str] = (), metadata: dict[str, Any] | None = None,
             expected_head: CheckpointId | None = _UNSET) -> CheckpointInfo:
        """Store ``state`` as the new head of ``thread_id``; its parent is the current head.

        With ``expected_head`` (an id, or None for "the thread must not exist yet") the save
        raises ConflictError instead of adding to a head that moved."""
        t0 = time.perf_counter()
        thread_key(thread_id)
        label, tags_t, meta = _check_meta(label, tags, metadata)
        if expected_head is not _UNSET and expected_head is not None:
            expected_head = _check_id(expected_head, "expected_head")
        with self._memo_lock:
            built = tree.build(state, self.types, self._memo)  # raises before writing anything
        root, size, nodes = built.root, built.size, built.objects
        encoded = built.data if size <= STATE_CACHE_BYTES // 4 else None
        del built  # a big state's encoding is not kept while its packs are written
        # A small root node goes inside the record instead of into an object of its own.
        root_node = nodes[root]
        inline = root_node if inlinable(root_node) else None
        if inline is not None:
            nodes = dict(nodes)
            del nodes[root]
        current = self._known.get(thread_id, _UNSET)
        known = self._have.get(thread_id)
        saved: dict[str, Any] = {}

        def change(ref: Ref | None) -> tuple[Head, dict[ObjectId, bytes]]:
            if ref is None:
                head = Head(thread_id, None, lineage=new_lineage())
            else:
                head = ref.head
            # Objects a head of this lineage held are held by every later head of it: skip
            # writing the nodes this process saw there. Otherwise write them all.
            skip = known if known is not None and known.lineage == head.lineage else None
            new = dict(nodes) if skip is None else skip.missing(nodes)
            parents = (head.head,) if head.head else ()
            record = Record(thread_id, parents, root, head.head_step + 1, time.time(), size,
                            label, tags_t, meta, inline)
            data = record.encode()
            cid = CheckpointId(object_id(data))
            new[ObjectId(cid)] = data
            saved["entry"] = entry = record.entry(cid)
            segments: dict[ObjectId, bytes] = {}
            new_head = log_append(head, entry, segments)
            # Retention on save (open(keep_last=N)): every few saves past N, drop the oldest
            # unlabelled checkpoints in this same compare-and-swap (gc.prune_due: amortised).
            if self.keep_last is not None and gcmod.prune_due(new_head.count, self.keep_last):
                segments.clear()
                new_head = gcmod.pruned_head(self.refs, head, entry, self.keep_last, segments)
                segments = self.refs.missing(head, segments)
            new.update(segments)
            saved["new"], saved["lineage"], saved["skip"] = new, head.lineage, skip
            return new_head, new

        self._known.pop(thread_id, None)
        self._have.pop(thread_id, None)
        ref = self.refs.update(thread_id, change, expected_head=expected_head, current=current,
                               done=lambda r: "entry" in saved
                               and self.refs.holds(r.head, saved["entry"]))
        entry: LogEntry = saved["entry"]
        if encoded is not None:
            self._remember_state(root, encoded)
        if ref is not None and ref.head.lineage == saved["lineage"]:
            self._known[thread_id] = ref
            have = saved["skip"] or _Known(saved["lineage"])
            have.ids.update(saved["new"])  # every node not known before; the rest already were
            self._have[thread_id] = have
        log.debug("save thread=%r id=%s bytes=%d in %.1f ms", thread_id, entry.id, entry.size,
                  (time.perf_counter() - t0) * 1000)
        return _info(entry, thread_id)

    # --- reading ---

    def _ref(self, thread_id: str) -> Ref:
        ref = self.refs.read(thread_id)
        if ref is None or ref.head.head is None:
            raise NotFoundError(f"thread {thread_id!r} does not exist in {self.url}; "
                                "threads() lists the threads there are")
        return ref

    def _entry(self, thread_id: str, head: Head, cid: CheckpointId) -> LogEntry:
        for entry in self.refs.iter_newest_first(head):
            if entry.id == cid:
                return entry
        raise NotFoundError(
            f"checkpoint {cid} is not in thread {thread_id!r}; history({thread_id!r}) lists its "
            "checkpoints, and get(id) loads a checkpoint of any thread"
        )

    def load(self, thread_id: str, checkpoint_id: CheckpointId | None = None) -> Checkpoint:
        """The head of ``thread_id``, or one of its checkpoints by id."""
        t0 = time.perf_counter()
        cid = None if checkpoint_id is None else _check_id(checkpoint_id)
        for attempt in range(LOAD_RETRIES):
            ref = self._ref(thread_id)
            try:
                cp = self._load_ref(thread_id, ref, cid)
                break
            except NotFoundError:
                # A pack merged away and collected since we read the ref? Read it again.
                if attempt + 1 == LOAD_RETRIES or self.refs.read(thread_id) == ref:
                    raise
        log.debug("load thread=%r id=%s bytes=%d in %.1f ms", thread_id, cp.id, cp.size,
                  (time.perf_counter() - t0) * 1000)
        return cp

    def _load_ref(self, thread_id: str, ref: Ref, checkpoint_id: CheckpointId | None
                  ) -> Checkpoint:
        head = ref.head
        cid = head.head if checkpoint_id is None else checkpoint_id
        assert cid is not None
        view = self.objects.view(head)
        if checkpoint_id is not None and cid != head.head:
            self._entry(thread_id, head, cid)
        elif all(e.id != cid for e in head.tail):  # a head edited to point outside its log
            try:
                self._entry(thread_id, head, cid)
            except (IntegrityError, FormatError) as exc:  # the log is damaged, the head is not
                log.warning("thread %r: cannot check its head against its log: %s", thread_id,
                            exc)
            except NotFoundError as exc:
                if "is not in thread" in str(exc):
                    raise
                log.warning("thread %r: cannot check its head against its log: %s", thread_id,
                            exc)
        cp = self._load(view, cid, thread_id)
        if cid == head.head:  # a save that follows this load need not write what it holds
            self._known[thread_id] = ref
            self._have[thread_id] = _Known(head.lineage, view)
        return cp

    def get(self, checkpoint_id: CheckpointId) -> Checkpoint:
        """Any checkpoint by id alone, whatever its thread (this looks through the threads'
        logs: ``load(thread_id, checkpoint_id)`` is faster when you know the thread)."""
        cid = _check_id(checkpoint_id)
        heads = [r.head for r in map(self.refs.read, self.threads()) if r is not None]
        for head in heads:
            if head.head is not None and any(
                    e.id == cid for e in self.refs.iter_newest_first(head)):
                return self._load(self.objects.view(head), cid, None)
        for head in heads:  # rewound or pruned out of every log: its objects stay until repacked
            view = self.objects.view(head)
            if cid in view.ids():
                return self._load(view, cid, None)
        raise NotFoundError(f"checkpoint {cid} does not exist in {self.url}")

    def _remember_state(self, root: str, data: bytes) -> None:
        """Keep a state's encoding by its root id (content-addressed: it cannot go stale), so a
        later load of that state decodes it in one pass."""
        if len(data) > STATE_CACHE_BYTES // 4:
            return
        with self._memo_lock:
            if root not in self._states:
                self._states_bytes += len(data)
            self._states[root] = data
            self._states.move_to_end(root)
            while self._states_bytes > STATE_CACHE_BYTES:
                self._states_bytes -= len(self._states.popitem(last=False)[1])

    def _load(self, view: View, cid: CheckpointId, thread_id: str | None) -> Checkpoint:
        try:
            record = Record.decode(view.get(cid))
        except NotFoundError:
            raise NotFoundError(f"checkpoint {cid} does not exist in {self.url}") from None
        with self._memo_lock:
            cached = self._states.get(record.root)
        if cached is not None:
            return self._checkpoint(cid, thread_id, record,
                                    codec.decode(cached, types=self.types))
        inline = record.root_node

        def fetch(oids: list[ObjectId]) -> dict[str, bytes]:
            if inline is None:
                return view.get_many(oids)
            # the root is in the record (its hash covers it): read only the nodes under it
            out = view.get_many(o for o in oids if o != record.root)
            if record.root in oids:
                out[record.root] = inline
            return out

        state = tree.load(record.root, fetch, self.types,
                          max_bytes=2 * record.size + (1 << 20))
        return self._checkpoint(cid, thread_id, record, state)

    @staticmethod
    def _checkpoint(cid: CheckpointId, thread_id: str | None, record: Record,
                    state: Any) -> Checkpoint:
        return Checkpoint(cid, thread_id or record.thread_id, record.step, record.parents,
                          datetime.fromtimestamp(record.created_at, UTC), record.size,
                          record.label, record.tags, record.metadata, state)

    def history(self, thread_id: str, *, limit: int | None = None,
                before: CheckpointId | None = None) -> list[CheckpointInfo]:
        """Checkpoints of a thread, newest first (by when they were added), without states.
        ``before`` starts just after that checkpoint."""
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise InvalidArgumentError("limit must be a non-negative int or None")
        head = self._ref(thread_id).head
        out: list[CheckpointInfo] = []
        skipping = before is not None
        if before is not None:
            before = _check_id(before, "before")
        for entry in self.refs.iter_newest_first(head):
            if limit is not None and len(out) >= limit:
                break
            if skipping:
                skipping = entry.id != before
                continue
            out.append(_info(entry, thread_id))
        if skipping:
            raise NotFoundError(f"checkpoint {before} is not in thread {thread_id!r}")
        return out

    def find(self, thread_id: str, *, label: str | None = None, tag: str | None = None,
             metadata: Mapping[str, Any] | None = None) -> list[CheckpointInfo]:
        """Checkpoints (newest first) with this label, this tag and these metadata values."""
        out = []
        for entry in self.refs.iter_newest_first(self._ref(thread_id).head):
            if label is not None and entry.label != label:
                continue
            if tag is not None and tag not in entry.tags:
                continue
            if metadata and any(entry.metadata.get(k, _UNSET) != v for k, v in metadata.items()):
                continue
            out.append(_info(entry, thread_id))
        return out

    def threads(self) -> list[str]:
        """Every thread in the store, sorted."""
        return self.refs.threads()

    def count(self, thread_id: str) -> int:
        """Number of checkpoints in a thread (from its head alone)."""
        return self._ref(thread_id).head.count

    def head(self, thread_id: str) -> CheckpointId | None:
        """The head checkpoint id of a thread, or None if the thread does not exist."""
        ref = self.refs.read(thread_id)
        return ref.head.head if ref else None

    # --- history edits (they change refs only; gc reclaims the objects) ---

    def fork(self, thread_id: str, checkpoint_id: CheckpointId,
             new_thread_id: str) -> CheckpointInfo:
        """Start ``new_thread_id`` at a checkpoint of ``thread_id``, with its ancestry as
        history. No state is copied."""
        cid = _check_id(checkpoint_id)
        thread_key(new_thread_id)
        entries = self.refs.entries(self._ref(thread_id).head)
        by_id = {e.id: e for e in entries}
        if cid not in by_id:
            self._entry(thread_id, Head(thread_id, None), cid)
        keep: set[str] = set()
        todo = [cid]
        while todo:
            c = todo.pop()
            if c in by_id and c not in keep:
                keep.add(c)
                todo.extend(by_id[c].parents)
        kept = [e for e in entries if e.id in keep]
        src = self._ref(thread_id).head

        def change(ref: Ref | None) -> tuple[Head, dict[ObjectId, bytes]]:
            new: dict[ObjectId, bytes] = {}
            base = Head(new_thread_id, None, packs=src.packs, inline=src.inline,
                        lineage=new_lineage())
            return build(base, kept, cid, new), self.refs.missing(src, new)

        if self.refs.read(new_thread_id) is not None:
            raise InvalidArgumentError(f"thread {new_thread_id!r} already exists; delete it or "
                                       "fork into another name")
        ref = self.refs.update(new_thread_id, change, expected_head=None, current=None)
        if ref is not None:  # the fork holds what its source held: a save need not resend it
            self._known[new_thread_id] = ref
            self._have[new_thread_id] = _Known(ref.head.lineage, self.objects.view(ref.head))
        log.info("fork %r at %s into %r", thread_id, cid, new_thread_id)
        return _info(by_id[cid], new_thread_id)

    def rewind(self, thread_id: str, checkpoint_id: CheckpointId, *,
               expected_head: CheckpointId | None = _UNSET) -> CheckpointInfo:
        """Move the head back to a checkpoint; checkpoints added after it leave the thread."""
        cid = _check_id(checkpoint_id)
        found: dict[str, LogEntry] = {}

        def change(ref: Ref | None) -> tuple[Head, dict[ObjectId, bytes]]:
            if ref is None or ref.head.head is None:
                raise NotFoundError(f"thread {thread_id!r} does not exist")
            entries = self.refs.entries(ref.head)
            ids = [e.id for e in entries]
            if cid not in ids:
                self._entry(thread_id, Head(thread_id, None), cid)
            kept = entries[: ids.index(cid) + 1]
            found["entry"] = kept[-1]
            new: dict[ObjectId, bytes] = {}
            return build(ref.head, kept, cid, new), self.refs.missing(ref.head, new)

        self._known.pop(thread_id, None)
        self.refs.update(thread_id, change, expected_head=expected_head,
                         current=self._ref(thread_id))
        log.info("rewind %r to %s", thread_id, cid)
        return _info(found["entry"], thread_id)

    def delete(self, thread_id: str, checkpoint_id: CheckpointId) -> None:
        """Remove one checkpoint from a thread. If it was the head, the head moves to its
        parent (or the newest remaining checkpoint); the last one removed deletes the thread."""
        cid = _check_id(checkpoint_id)

        def change(ref: Ref | None) -> tuple[Head | None, dict[ObjectId, bytes]]:
            if ref is None or ref.head.head is None:
                raise NotFoundError(f"thread {thread_id!r} does not exist")
            entries = self.refs.entries(ref.head)
            gone = next((e for e in entries if e.id == cid), None)
            if gone is None:
                self._entry(thread_id, Head(thread_id, None), cid)
            assert gone is not None
            kept = [e for e in entries if e.id != cid]
            if not kept:
                return None, {}
            head_id = ref.head.head
            if head_id == cid:
                ids = {e.id for e in kept}
                head_id = next((p for p in gone.parents if p in ids), kept[-1].id)
            new: dict[ObjectId, bytes] = {}
            return build(ref.head, kept, head_id, new), self.refs.missing(ref.head, new)

        self._known.pop(thread_id, None)
        self.refs.update(thread_id, change, current=self._ref(thread_id))
        log.info("delete %s from %r", cid, thread_id)

    def delete_thread(self, thread_id: str) -> None:
        """Remove a thread's ref; its objects stay until gc."""
        self._known.pop(thread_id, None)
        self.refs.update(thread_id, lambda ref: (None, {}), current=self._ref(thread_id))
        log.info("delete thread %r", thread_id)

    # --- audit (verify.py) ---

    def verify(self, *, deep: bool = True, sample: float | None = None,
               thread_id: str | None = None, progress: Progress | None = None) -> VerifyReport:
        """Audit the store: every ref, pack, log segment, record and state node a ref reaches
        exists, re-hashes to its name and agrees with what names it; ``deep`` also re-hashes
        every object no checkpoint reaches (or a random ``sample`` fraction of them). Problems
        name the threads and checkpoints they break; ``report.ok``, ``report.to_text()``,
        ``report.to_json()``."""
        return _verify(self.backend, self.refs, deep=deep, sample=sample, thread_id=thread_id,
                       progress=progress)

    # --- retention and garbage collection (gc.py) ---

    def prune(self, thread_id: str | None = None, *, keep_last: int | None = None,
              older_than: timedelta | None = None, keep_labeled: bool = True,
              keep_tags: Iterable[str] = (), dry_run: bool = False) -> gcmod.PruneReport:
        """Drop checkpoints from threads' logs (every thread when ``thread_id`` is None). Kept:
        the head, the last ``keep_last`` checkpoints, those created within ``older_than``, (with
        ``keep_labeled``, the default) those with a label, and those with one of ``keep_tags``
        (tags alone keep nothing unless listed). ``report.reasons`` counts what each rule kept.
        Refs only, by compare-and-swap (a concurrent save is never lost); no object is deleted
        until repack() and gc()."""
        threads = self.threads() if thread_id is None else [thread_id]
        if thread_id is not None:
            self._ref(thread_id)
        report = gcmod.prune(self.refs, threads, keep_last=keep_last, older_than=older_than,
                             keep_labeled=keep_labeled, dry_run=dry_run, keep_tags=keep_tags)
        for t in report.threads:
            self._known.pop(t, None)
        if report.removed:
            log.info("prune %s", report.to_text().replace("\n", "; "))
        return report

    def repack(self, thread_id: str | None = None, *, min_garbage: float = 0.25,
               dry_run: bool = False) -> RepackReport:
        """Rewrite the packs of each thread (every thread when ``thread_id`` is None) in which at
        least ``min_garbage`` of the bytes belong to no checkpoint of its log (after prune,
        rewind or delete), keeping only what its checkpoints reach. The old packs become
        garbage: ``gc()`` deletes them once they are older than its grace. Safe while others
        save (compare-and-swap)."""
        threads = self.threads() if thread_id is None else [thread_id]
        if thread_id is not None:
            self._ref(thread_id)
        report = repackmod.repack(self.refs, threads, min_garbage=min_garbage, dry_run=dry_run)
        for t in report.threads:
            if t.repacked:
                self._known.pop(t.thread_id, None)
                self._have.pop(t.thread_id, None)
        log.info("%s", report.to_text())
        return report

    def gc(self, *, grace: timedelta = timedelta(hours=1), dry_run: bool = False,
           progress: gcmod.GCProgress | None = None, force: bool = False) -> gcmod.GCReport:
        """Delete every object no ref reaches that was last written or reused more than
        ``grace`` ago, by the storage's clock. Safe while other processes save (see the README,
        "How GC stays safe"). On S3 a grace under 1 s needs ``force=True``."""
        report = gcmod.collect(self.backend, grace=grace, dry_run=dry_run, progress=progress,
                               force=force)
        if not dry_run:
            self.objects.forget(report.deleted)
        log.info("%s", report.to_text())
        return report

    # --- sizes ---

    def storage_bytes(self) -> int:
        """Bytes stored under the root (packs and refs)."""
        return sum(i.size for i in self.backend.list("packs")) + sum(
            i.size for i in self.backend.list("refs"))

    def stats(self) -> StoreStats:
        """Logical bytes (every checkpoint's state, as if stored whole) against physical bytes
        stored. Reads the refs and lists the objects; reads no state."""
        sizes: dict[str, int] = {}
        threads = self.threads()
        for thread in threads:
            ref = self.refs.read(thread)
            if ref is not None:
                sizes.update((e.id, e.size) for e in self.refs.entries(ref.head))
        objects = self.backend.list("packs")
        refs = self.backend.list("refs")
        physical = sum(i.size for i in objects) + sum(i.size for i in refs)
        logical = sum(sizes.values())
        return StoreStats(len(threads), len(sizes), logical, physical, len(objects),
                          logical / physical if physical else 0.0, self.objects.hits,
                          self.objects.misses)
