"""``CheckpointStore``: the public face of cas_checkpoint (sync). Its logic is in ``core.py``,
shared with ``AsyncCheckpointStore`` (``aio.py``); each method here drives one step of it with
the backend's blocking calls."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from types import GeneratorType
from typing import Any, TypeVar

from cas_checkpoint.backends import Backend, backend_for, check_open_args, open_backend, sealed
from cas_checkpoint.engine import encryption as crypto
from cas_checkpoint.engine import settings as marker
from cas_checkpoint.engine.core import CACHE_BYTES, Core, log
from cas_checkpoint.engine.model import UNSET, Checkpoint, CheckpointInfo, StoreStats, Unset
from cas_checkpoint.engine.refs import HEADS
from cas_checkpoint.engine.retention import PruneReport
from cas_checkpoint.engine.steps import Step, run
from cas_checkpoint.errors import InvalidArgumentError
from cas_checkpoint.format import sealing
from cas_checkpoint.format.extypes import TypeRegistry
from cas_checkpoint.format.objects import CheckpointId
from cas_checkpoint.format.sealing import Encryption
from cas_checkpoint.maintenance import gc as gcmod
from cas_checkpoint.maintenance import gc_marks
from cas_checkpoint.maintenance import rekey as rotation
from cas_checkpoint.maintenance.expire import ExpireReport
from cas_checkpoint.maintenance.repack import RepackReport
from cas_checkpoint.maintenance.upkeep import Maintenance
from cas_checkpoint.maintenance.verify_report import Progress, VerifyReport
from cas_checkpoint.query.diff import StateDiff
from cas_checkpoint.query.diff import diff as diff_step
from cas_checkpoint.query.part import StatePart
from cas_checkpoint.query.part import read_part as part_step
from cas_checkpoint.query.search import SearchResult
from cas_checkpoint.query.search import search as search_step
from cas_checkpoint.transfer import bundle, copy
from cas_checkpoint.transfer.copy import CopyReport
from cas_checkpoint.transfer.receive import Progress as CopyProgress

__all__ = ["Checkpoint", "CheckpointInfo", "CheckpointStore", "StoreStats", "log"]

T = TypeVar("T")


class _Blocking:
    """An internal object (``store.refs``, ``store.objects``) whose steps run at once: for
    tests and tools that poke at the layers below the store."""

    def __init__(self, target: Any, backend: Backend,
                 runner: Callable[[Step[Any]], Any] | None = None) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_runner", runner or (lambda step: run(step, backend)))

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kw: Any) -> Any:
            out = attr(*args, **kw)
            return self._runner(out) if isinstance(out, GeneratorType) else out

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)


class CheckpointStore:
    """Checkpoints of agent state in a content-addressed object store.

    Open one with :meth:`open` (a directory path, ``memory://name``, ``s3://bucket/prefix``) or
    build it from an fsspec filesystem and a root: ``CheckpointStore(fs, "bucket/prefix")``.
    """

    _copy = "copy_threads"  # what copies between stores of this class

    def __init__(self, fs: Any, root: str, *, types: Iterable[type] = (),
                 allow_unsafe: bool = False, keep_last: int | None = None,
                 keep_mode: str = "batch", cache_dir: str | None = None,
                 cache_bytes: int = CACHE_BYTES) -> None:
        self._init(Core(backend_for(fs, root, allow_unsafe=allow_unsafe), types, keep_last,
                        cache_dir, cache_bytes, keep_mode))

    @classmethod
    def open(cls, url: str | Any, *, storage_options: Mapping[str, Any] | None = None,
             types: Iterable[type] = (), allow_unsafe: bool = False,
             keep_last: int | None = None, keep_mode: str = "batch",
             cache_dir: str | Any | None = None,
             cache_bytes: int = CACHE_BYTES, retries: int | None = None,
             timeout: float | None = None, create: bool = True,
             compression: str | None = None, compression_level: int | None = None,
             encryption: Encryption = None) -> CheckpointStore:
        """Open (creating if needed) the store at ``url``; with ``create=False`` a URL that
        holds no store raises NotFoundError and nothing is created. ``types`` lists the dataclasses,
        pydantic models and enums that states may hold; nothing else is ever constructed.
        ``keep_last=N`` prunes each thread as it is saved to, keeping its last N checkpoints
        (and labelled ones); off by default, so no history is dropped unasked. With
        ``keep_mode="batch"`` (the default) it prunes every max(16, N // 4) saves past N (a
        thread holds up to N + that many; the log is rebuilt once per batch); with
        ``keep_mode="exact"`` every save past N drops what goes past N, in the save's own
        compare-and-swap (``keep_last=1``: a thread holds its latest checkpoint alone).
        Packs read are kept in memory (``cache_bytes``, LRU) and, with ``cache_dir``, in that
        local folder too (for S3 stores: a new process then reads its packs from disk). Packs
        are immutable and re-hashed when read back, so neither cache can go stale.
        Object storage: ``retries`` bounds the attempts at a failing request (6 by default;
        throttling and 5xx wait with exponential backoff, up to 2 s apart; an endpoint that
        never answered is not retried: a wrong URL fails in one timeout), and ``timeout`` how
        long each attempt may wait to connect and for each read (30 s by default). botocore and
        s3fs retry nothing on their own, so a request gives up after about ``retries`` x
        ``timeout`` with a StorageError naming the endpoint.
        Packs are compressed with zstd (``compression_level`` 1-19, 3 by default) unless the
        store is created with ``compression="none"``; objects keep their names (the hash of
        their uncompressed bytes), so sharing holds. A store keeps the settings it was created
        with (in its root object, ``cas-store``, written by its first write or by ``init``):
        opened without ``compression=``, it writes by its own; opened with other settings, it
        raises InvalidArgumentError. A store written before settings existed gets them at its
        next write (its plain packs stay readable).
        ``encryption=Key.from_env("CAS_KEY")`` (a ``Key``; a list ``[new, old, ...]``: the first
        writes, all read; or a callable ``key_id -> Key | None``) encrypts packs and refs with
        AES-256-GCM, deterministically, so sharing holds; thread ids are hidden from paths. An
        encrypted store opened without a key raises InvalidArgumentError;
        ``encryption="keyless"`` opens it for ``gc`` and ``verify(deep=False)`` only."""
        check_open_args(retries, timeout)
        settings = marker.Settings.of(compression, compression_level)
        ring = sealing.Keyring.of(encryption)
        store = cls.__new__(cls)
        url = str(url) if hasattr(url, "__fspath__") else url
        backend = open_backend(url, dict(storage_options or {}), allow_unsafe=allow_unsafe,
                               retries=retries, timeout=timeout, create=create)
        if ring is not None:
            backend = sealed.SealedBackend(backend, ring)
        store._init(Core(backend, types, keep_last, cache_dir, cache_bytes, keep_mode))
        store._core.objects.wanted = settings
        if isinstance(backend, sealed.SealedBackend):
            store._run(crypto.opening(url, store._core.objects, backend, create))
        else:
            store._run(marker.opening(url, store._core.objects, create))
        return store

    @classmethod
    def init(cls, url: str | Any, **options: Any) -> CheckpointStore:
        """Create a store at ``url`` (its root object, ``cas-store``, holding its settings, so
        that an empty store is still a store) and open it; an existing store is opened as it is
        (InvalidArgumentError if its settings differ from those given). Takes :meth:`open`'s
        options."""
        store = cls.open(url, **options)
        objects = store._core.objects
        objects.adopt(store._run(marker.settle(store.url, objects.wanted, write=True)))
        return store

    @classmethod
    def from_backend(cls, backend: Backend, *, types: Iterable[type] | TypeRegistry = (),
                     keep_last: int | None = None, keep_mode: str = "batch",
                     cache_dir: str | Any | None = None,
                     cache_bytes: int = CACHE_BYTES) -> CheckpointStore:
        """A store over a backend object (``cas_checkpoint.backends``): another store object
        on the same storage, with caches of its own."""
        store = cls.__new__(cls)
        store._init(Core(backend, types, keep_last, cache_dir, cache_bytes, keep_mode))
        return store

    def _init(self, core: Core) -> None:
        self._core = core
        self._upkeep = Maintenance(core)
        self.backend = core.backend
        self.types = core.types
        self.keep_last = core.keep_last
        self.keep_mode = core.keep_mode
        self.refs: Any = _Blocking(core.refs, core.backend)
        self.objects: Any = _Blocking(core.objects, core.backend)

    def _run(self, step: Step[T]) -> T:
        return run(step, self.backend)

    @property
    def url(self) -> str:
        return self.backend.url

    def __repr__(self) -> str:
        return f"CheckpointStore({self.url!r})"

    # --- writing ---

    def save(self, thread_id: str, state: Any, *, label: str | None = None,
             tags: Iterable[str] = (), metadata: dict[str, Any] | None = None,
             expected_head: CheckpointId | None | Unset = UNSET, status: str | None = None,
             kind: str | None = None, reason: str | None = None,
             keep_last: int | None | Unset = UNSET) -> CheckpointInfo:
        """Store ``state`` as the new head of ``thread_id``; its parent is the current head.

        With ``expected_head`` (an id, or None for "the thread must not exist yet") the save
        raises ConflictError instead of adding to a head that moved. ``status`` (in_progress,
        completed, failed, halted; ``reason`` says why for the last two) and ``kind``
        (automatic, manual, pre_operation, recovery) are stored with the checkpoint and its
        log entry: ``find``/``history`` filter on them without loading states. ``keep_last=N``
        keeps the thread's last N checkpoints exactly (and the labelled ones), dropping the
        rest in this save's compare-and-swap, whatever the store's own ``keep_last``."""
        with self._core.turns.hold(thread_id):  # (this process's saves to it take turns)
            return self._run(self._core.save(thread_id, state, label=label, tags=tags,
                                             metadata=metadata, expected_head=expected_head,
                                             status=status, kind=kind, reason=reason,
                                             keep_last=keep_last))

    # --- reading ---

    def load(self, thread_id: str, checkpoint_id: CheckpointId | None = None) -> Checkpoint:
        """The head of ``thread_id``, or one of its checkpoints by id."""
        return self._run(self._core.load(thread_id, checkpoint_id))

    def get(self, checkpoint_id: CheckpointId) -> Checkpoint:
        """Any checkpoint by id alone, whatever its thread (this looks through the threads'
        logs: ``load(thread_id, checkpoint_id)`` is faster when you know the thread)."""
        return self._run(self._core.get(checkpoint_id))

    def diff(self, a_id: CheckpointId, b_id: CheckpointId) -> StateDiff:
        """What changed from checkpoint ``a_id`` to ``b_id`` (any two, of any threads):
        ``d.changes``, a list of ``Change(path, op, old, new)`` with ``op`` one of "added",
        "removed", "changed" and ``path`` like ``'["messages"][41]["content"]'``. Subtrees
        both states share are skipped unread (``d.nodes_read`` says how many nodes it read)."""
        return self._run(diff_step(self._core, a_id, b_id))

    def read_part(self, thread_id: str, checkpoint_id: CheckpointId | None = None,
                  path: Sequence[Any] = (), *, start: int = 0,
                  count: int = 100) -> StatePart:
        """One part of a checkpoint's state (the head's, without ``checkpoint_id``), read
        without the rest: ``path`` is a list of dict keys and list indexes (``["messages",
        -1]``; ``()`` is the whole state), and only the nodes on the way to it and its own
        are read. ``part.value`` is the value there, one node deep: lists, dicts, str and
        bytes stored in nodes of their own inside it stand as ``Unread(kind, length)``; a
        list gives the items ``start`` .. ``start + count`` (``part.length`` says how many it
        has). ``part.nodes_read`` counts the tree nodes read."""
        return self._run(part_step(self._core, thread_id, checkpoint_id, path, start, count))

    def search(self, query: str, *, regex: bool = False, thread_id: str | None = None,
               all_history: bool = False, limit: int | None = None,
               progress: Callable[[int, int], object] | None = None,
               checkpoint_id: CheckpointId | None = None) -> SearchResult:
        """The str values that contain ``query`` (case-insensitive; ``regex=True``: a Python
        regular expression) in the head of every thread (or of ``thread_id``; with
        ``checkpoint_id``, in that checkpoint of it), or with ``all_history`` in every
        checkpoint of them: ``r.matches``, each a ``Match(thread_id, checkpoint_id, path,
        snippet)``. Nodes that threads share are read once."""
        return self._run(search_step(self._core, query, regex=regex, thread_id=thread_id,
                                     all_history=all_history, limit=limit, progress=progress,
                                     checkpoint_id=checkpoint_id))

    def history(self, thread_id: str, *, limit: int | None = None,
                before: CheckpointId | None = None, kind: str | Iterable[str] | None = None,
                status: str | Iterable[str] | None = None) -> list[CheckpointInfo]:
        """Checkpoints of a thread, newest first (by when they were added), without states.
        ``before`` starts just after that checkpoint; ``kind``/``status`` (a value or a list)
        keep only those checkpoints (``limit`` counts the ones kept)."""
        return self._run(self._core.history(thread_id, limit=limit, before=before, kind=kind,
                                            status=status))

    def find(self, thread_id: str, *, label: str | None = None, tag: str | None = None,
             metadata: Mapping[str, Any] | None = None, status: str | Iterable[str] | None = None,
             kind: str | Iterable[str] | None = None) -> list[CheckpointInfo]:
        """Checkpoints (newest first) with this label, this tag, these metadata values, this
        status and this kind (each a value or a list of them)."""
        return self._run(self._core.find(thread_id, label=label, tag=tag, metadata=metadata,
                                         status=status, kind=kind))

    def threads(self) -> list[str]:
        """Every thread in the store, sorted (a list of them all: ``iter_threads`` for a store
        of very many)."""
        return self._run(self._core.threads())

    def iter_threads(self) -> Iterator[str]:
        """Every thread in the store, unsorted, a page of the storage's listing at a time (S3:
        up to 1,000 a request; local disk: 1,000 from the directory as it is read), so a
        store of a million threads lists without holding a million names."""
        refs = self._core.refs
        for page in self.backend.list_pages(HEADS):
            yield from self._run(refs.threads_in(page))

    def count(self, thread_id: str) -> int:
        """Number of checkpoints in a thread (from its head alone)."""
        return self._run(self._core.count(thread_id))

    def head(self, thread_id: str) -> CheckpointId | None:
        """The head checkpoint id of a thread, or None if the thread does not exist."""
        return self._run(self._core.head(thread_id))

    # --- history edits (they change refs only; gc reclaims the objects) ---

    def fork(self, thread_id: str, checkpoint_id: CheckpointId,
             new_thread_id: str) -> CheckpointInfo:
        """Start ``new_thread_id`` at a checkpoint of ``thread_id``, with its ancestry as
        history. No state is copied."""
        return self._run(self._core.fork(thread_id, checkpoint_id, new_thread_id))

    def rewind(self, thread_id: str, checkpoint_id: CheckpointId, *,
               expected_head: CheckpointId | None | Unset = UNSET) -> CheckpointInfo:
        """Move the head back to a checkpoint; checkpoints added after it leave the thread."""
        return self._run(self._core.rewind(thread_id, checkpoint_id,
                                           expected_head=expected_head))

    def delete(self, thread_id: str, *checkpoint_ids: CheckpointId,
               expected_head: CheckpointId | None | Unset = UNSET) -> None:
        """Remove these checkpoints from a thread, in one compare-and-swap (refs only; objects
        stay until repack and gc): checkpoints saved meanwhile stay, and an id not in the thread
        raises NotFoundError with nothing removed. If the head goes, it moves to its nearest
        ancestor that stays (or the newest remaining checkpoint); removing every checkpoint
        deletes the thread. With ``expected_head``, another head raises ConflictError."""
        self._run(self._core.delete(thread_id, *checkpoint_ids, expected_head=expected_head))

    def delete_thread(self, thread_id: str) -> None:
        """Remove a thread's ref; its objects stay until gc."""
        self._run(self._core.delete_thread(thread_id))

    # --- audit (verify.py) ---

    def verify(self, *, deep: bool = True, sample: float | None = None,
               thread_id: str | None = None, progress: Progress | None = None) -> VerifyReport:
        """Audit the store. ``deep`` (the default): every ref, pack, log segment, record and
        state node a ref reaches exists, re-hashes to its name and agrees with what names it,
        and every object no checkpoint reaches is re-hashed too (or a random ``sample``
        fraction of them). ``deep=False`` reads the refs (decoded and checked) and, from a
        listing, finds each pack they name present at the size its ref records: no pack is
        read (on S3: one GET a ref, a LIST page per 1,000 packs). Problems name the threads
        (deep: and checkpoints) they break; ``report.ok``, ``report.to_text()``,
        ``report.to_json()``."""
        return self._run(self._upkeep.verify(deep=deep, sample=sample, thread_id=thread_id,
                                           progress=progress))

    # --- retention and garbage collection (gc.py) ---

    def prune(self, thread_id: str | None = None, *, keep_last: int | None = None,
              older_than: timedelta | None = None, keep_labeled: bool = True,
              keep_tags: Iterable[str] = (), dry_run: bool = False) -> PruneReport:
        """Drop checkpoints from threads' logs (every thread when ``thread_id`` is None). Kept:
        the head, the last ``keep_last`` checkpoints, those created within ``older_than``, (with
        ``keep_labeled``, the default) those with a label, and those with one of ``keep_tags``
        (tags alone keep nothing unless listed). ``report.reasons`` counts what each rule kept.
        Refs only, by compare-and-swap (a concurrent save is never lost); no object is deleted
        until repack() and gc()."""
        return self._run(self._upkeep.prune(thread_id, keep_last=keep_last, older_than=older_than,
                                          keep_labeled=keep_labeled, keep_tags=keep_tags,
                                          dry_run=dry_run))

    def expire(self, *, idle_for: timedelta, dry_run: bool = False, keep_labeled: bool = False,
               keep_tags: Iterable[str] = (), thread_id: str | None = None,
               group: Callable[[str], str | None] | None = None) -> ExpireReport:
        """Delete the refs of threads idle for ``idle_for`` or more: neither saved to (nor
        forked, pruned, rewritten) within it, by the storage's clock, nor holding a checkpoint
        created within it. Kept on request: threads with a labelled checkpoint
        (``keep_labeled=True``) or one tagged with one of ``keep_tags``. Each ref is deleted by
        compare-and-swap on the version judged idle: a thread saved to meanwhile is kept.
        Threads that ``group(thread_id)`` maps to one key (not None) expire together, when all
        of them are idle (e.g. one session's threads; the LangGraph saver groups a thread's
        namespaces so). Refs only: ``gc()`` then deletes what only the expired threads reached.
        ``report.expired``
        (thread id -> ``ExpiredThread``), ``report.kept`` (threads kept, per reason),
        ``report.requests`` (storage requests by kind), ``report.to_text()``."""
        return self._run(self._upkeep.expire(idle_for=idle_for, dry_run=dry_run,
                                             keep_labeled=keep_labeled, keep_tags=keep_tags,
                                             thread_id=thread_id, group=group))

    def repack(self, thread_id: str | None = None, *, min_garbage: float = 0.25,
               dry_run: bool = False) -> RepackReport:
        """Rewrite the packs of each thread (every thread when ``thread_id`` is None) in which at
        least ``min_garbage`` of the bytes belong to no checkpoint of its log (after prune,
        rewind or delete), keeping only what its checkpoints reach. The old packs become
        garbage: ``gc()`` deletes them once they are older than its grace. Safe while others
        save (compare-and-swap)."""
        return self._run(self._upkeep.repack(thread_id, min_garbage=min_garbage, dry_run=dry_run))

    def gc(self, *, grace: timedelta = timedelta(hours=1), dry_run: bool = False,
           progress: gcmod.GCProgress | None = None, force: bool = False,
           repack: bool = False, min_garbage: float = 0.25,
           from_marks: bool = False) -> gcmod.GCReport:
        """Delete every object no ref reaches that was last written or reused more than
        ``grace`` ago, by the storage's clock. Safe while other processes save (see the README,
        "How GC stays safe"). On S3 a grace under 1 s needs ``force=True``. With ``repack``,
        first ``repack(min_garbage=...)`` every thread (``report.repack``); a dry run then
        counts as if that repack had been done, so it predicts what the run deletes. With
        ``from_marks``, the refs' packs come from the marks of ``gc_mark`` (one of each share,
        taken within the grace; else ``InvalidArgumentError`` and nothing is deleted), refs
        written since are read again. Every argument is checked before anything changes."""
        return self._run(self._upkeep.gc(grace=grace, dry_run=dry_run, progress=progress,
                                       force=force, repack=repack, min_garbage=min_garbage,
                                       from_marks=from_marks))

    def gc_mark(self, *, shard: int, of: int) -> gc_marks.MarkReport:
        """gc's reading work for share ``shard`` (1 to ``of``) of the refs: read them and write
        what each names to a mark in the store (``report.key``); when every share is marked
        (by as many processes or machines), one ``gc(from_marks=True)`` deletes. See
        docs/operations/large-stores.md."""
        return self._run(self._upkeep.gc_mark(shard=shard, of=of))

    # --- moving threads between stores (bundle.py, copy.py) ---

    def export_thread(self, thread_id: str, dest: bundle.Dest, *,
                      progress: bundle.Progress | None = None) -> bundle.BundleReport:
        """Write a thread (its whole history: checkpoints, labels, tags, metadata, the parent
        DAG) and every object its checkpoints reach into one bundle file, like ``git bundle``.
        ``dest``: a path (written beside itself, then renamed into place) or a binary file
        object. ``progress(done, total)`` is called as objects go by."""
        return self._run(bundle.export_step(self._core, thread_id, dest, progress))

    def import_bundle(self, src: bundle.Dest, *, as_thread: str | None = None,
                      progress: bundle.Progress | None = None) -> bundle.BundleReport:
        """Read a bundle (a path or a readable binary file) into this store, as its thread or
        as ``as_thread``. Every object is re-hashed and the history checked; only objects this
        store does not hold are written, and the thread's ref last. A thread that already has
        this history is left as it is; one whose history is a prefix of the bundle's is
        fast-forwarded; any other raises ``ConflictError`` (import with ``as_thread=``)."""
        return self._run(bundle.import_step(self._core, src, as_thread, progress))

    # --- sizes ---

    def settings(self) -> dict[str, Any]:
        """The store's settings, as its root object keeps them (a store that has none yet: what
        its first write will give it): ``{"compression": None or "zstd", "compression_level":
        int or None, "encryption": None or the cipher suite, "key_id": str or None}``."""
        got = self._run(self._core.objects.current())
        return {"compression": got.compression, "compression_level": got.level,
                "encryption": got.encryption, "key_id": got.key_id}

    def rekey(self) -> dict[str, Any]:
        """Rewrite every thread's packs and head under the first key given to ``open`` (by
        compare-and-swap: safe while others write; the old packs become garbage for ``gc``),
        and retire the other keys' files: afterwards the old keys are no longer needed.
        Returns a report: ``threads``, ``packs_rewritten``, ``bytes_written``, ``key_id``,
        ``retired_key_ids``."""
        backend = self.backend
        if not isinstance(backend, sealed.SealedBackend):
            raise InvalidArgumentError("rekey needs an encrypted store opened with its keys: "
                                       "CheckpointStore.open(url, encryption=[new, old])")
        self._core._known.clear()
        return self._run(rotation.rekey(self._core.refs, backend))

    def storage_bytes(self) -> int:
        """Bytes stored under the root (packs and refs)."""
        return self._run(self._upkeep.storage_bytes())

    def stats(self, *, by_thread: bool = False) -> StoreStats:
        """Logical bytes (every checkpoint's state, as if stored whole) against physical bytes
        stored. Reads the refs and lists the objects; reads no state. ``by_thread=True`` also
        fills ``by_thread`` (thread id -> ``ThreadStats``: checkpoints, messages, logical and
        physical bytes, dedup ratio), and reads each thread's head state to count messages."""
        return self._run(self._upkeep.stats(by_thread))


def copy_threads(src: CheckpointStore, dst: CheckpointStore,
                 threads: Iterable[str] | None = None, *,
                 progress: CopyProgress | None = None) -> CopyReport:
    """Copy threads (all of them by default) from the store ``src`` into the store ``dst``,
    each with its whole history, writing only the objects ``dst`` does not hold. Each thread's
    ref is written last, so a copy killed half way leaves garbage at most (gc takes it) and
    running it again finishes it, writing only what the first run did not. A thread that
    exists in ``dst`` with another history raises ``ConflictError`` (threads before it are
    copied)."""
    s, d = copy.cores(src, dst, CheckpointStore)
    return run(copy.copy_step(s, d, threads, progress), d.backend)


def engine_for(store: CheckpointStore, types: TypeRegistry) -> Core:
    """An engine over ``store``'s storage and settings that stores the classes of ``types``:
    the internal API for an integration that drives engine steps as a third face (CasSaver)."""
    return store._core.with_types(types)
