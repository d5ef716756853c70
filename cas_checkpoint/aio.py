"""``AsyncCheckpointStore``: the awaitable face of cas_checkpoint, for agents that serve many
threads from one event loop.

    store = await AsyncCheckpointStore.open("s3://bucket/agents")
    info = await store.save("thread-1", state, label="after-tool")
    cp = await store.load("thread-1")
    async for info in store.history("thread-1", limit=50): ...

Every method runs the same step as ``CheckpointStore``'s (``core.py``) with ``ops.arun``: S3
requests are s3fs's native coroutines on the caller's loop (no thread per call), local disk
calls run on a small thread pool of the backend's, memory:// answers inline. A save encodes and
hashes on that thread pool (memory://: inline), so a large state does not hold the loop; a load
decodes on the loop.

Cancellation: a save (or any edit) cancelled before it sent its commit (the ref write) did not
land, and left at most unreferenced packs for gc. One cancelled after that finishes its commit
first (a request or two; the cancellation waits for it), then raises ``CancelledError``; then
``landed(exc)`` is what the call would have returned (a save's ``CheckpointInfo``), or None if
the commit lost. So after a cancelled save, ``landed(exc)`` tells the caller whether it landed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Generator, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from cas_checkpoint.backends import (
    Backend,
    backend_for,
    check_open_args,
    open_backend_async,
    sealed,
)
from cas_checkpoint.engine import encryption as crypto
from cas_checkpoint.engine import settings as marker
from cas_checkpoint.engine.core import CACHE_BYTES, Core
from cas_checkpoint.engine.model import UNSET, Checkpoint, CheckpointInfo, StoreStats, Unset
from cas_checkpoint.engine.refs import HEADS
from cas_checkpoint.engine.retention import PruneReport
from cas_checkpoint.engine.steps import Step, arun, landed
from cas_checkpoint.errors import InvalidArgumentError
from cas_checkpoint.format import sealing
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

__all__ = ["AsyncCheckpointStore", "landed"]

T = TypeVar("T")


class Listing:
    """A list of checkpoints to ``await`` whole or iterate with ``async for``."""

    def __init__(self, make: Any) -> None:
        self._make = make  # made when first awaited: an unused Listing leaves no coroutine
        self._items: list[CheckpointInfo] | None = None

    def __await__(self) -> Generator[Any, None, list[CheckpointInfo]]:
        return self._get().__await__()

    async def _get(self) -> list[CheckpointInfo]:
        if self._items is None:
            self._items = await self._make()
        return self._items

    async def __aiter__(self) -> AsyncIterator[CheckpointInfo]:
        for item in await self._get():
            yield item


class AsyncCheckpointStore:
    """Checkpoints of agent state in a content-addressed object store, awaitable.

    Open one with :meth:`open` (a directory path, ``memory://name``, ``s3://bucket/prefix``),
    inside the event loop that will use it. One store object serves any number of tasks at once.
    """

    _copy = "acopy_threads"  # what copies between stores of this class

    def __init__(self, fs: Any, root: str, *, types: Iterable[type] = (),
                 allow_unsafe: bool = False, keep_last: int | None = None,
                 keep_mode: str = "batch", cache_dir: str | None = None,
                 cache_bytes: int = CACHE_BYTES) -> None:
        """A store over an fsspec filesystem object (for S3, one made with
        ``asynchronous=True`` inside the running loop) and a root path inside it."""
        self._init(Core(backend_for(fs, root, allow_unsafe=allow_unsafe), types, keep_last,
                        cache_dir, cache_bytes, keep_mode))

    @classmethod
    async def open(cls, url: str | Any, *, storage_options: Mapping[str, Any] | None = None,
                   types: Iterable[type] = (), allow_unsafe: bool = False,
                   keep_last: int | None = None, keep_mode: str = "batch",
                   cache_dir: str | Any | None = None,
                   cache_bytes: int = CACHE_BYTES, retries: int | None = None,
                   timeout: float | None = None, create: bool = True,
                   compression: str | None = None, compression_level: int | None = None,
                   encryption: Encryption = None) -> AsyncCheckpointStore:
        """Open (creating if needed) the store at ``url``; the arguments are those of
        ``CheckpointStore.open``. For S3 this makes an s3fs session bound to the running event
        loop: use the store from that loop, and ``await store.aclose()`` (or ``async with``)
        when done."""
        check_open_args(retries, timeout)
        settings = marker.Settings.of(compression, compression_level)
        url = str(url) if hasattr(url, "__fspath__") else url
        backend = await open_backend_async(url, dict(storage_options or {}),
                                           allow_unsafe=allow_unsafe, retries=retries,
                                           timeout=timeout, create=create)
        ring = sealing.Keyring.of(encryption)
        if ring is not None:
            backend = sealed.SealedBackend(backend, ring)
        store = cls.__new__(cls)
        store._init(Core(backend, types, keep_last, cache_dir, cache_bytes, keep_mode))
        store._core.objects.wanted = settings
        try:
            if isinstance(backend, sealed.SealedBackend):
                await store._run(crypto.opening(url, store._core.objects, backend, create))
            else:
                await store._run(marker.opening(url, store._core.objects, create))
        except BaseException:
            await store.aclose()
            raise
        return store

    def _init(self, core: Core) -> None:
        self._core = core
        self._upkeep = Maintenance(core)
        self.backend: Backend = core.backend
        self.types = core.types
        self.keep_last = core.keep_last
        self.keep_mode = core.keep_mode

    async def _run(self, step: Step[T], offload: bool = False) -> T:
        return await arun(step, self.backend, offload=offload)

    @property
    def url(self) -> str:
        return self.backend.url

    def __repr__(self) -> str:
        return f"AsyncCheckpointStore({self.url!r})"

    async def aclose(self) -> None:
        """Release the store's connections (S3) and threads (local disk)."""
        await self.backend.aclose()

    async def __aenter__(self) -> AsyncCheckpointStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- writing ---

    async def save(self, thread_id: str, state: Any, *, label: str | None = None,
                   tags: Iterable[str] = (), metadata: dict[str, Any] | None = None,
                   expected_head: CheckpointId | None | Unset = UNSET, status: str | None = None,
                   kind: str | None = None, reason: str | None = None,
                   keep_last: int | None | Unset = UNSET) -> CheckpointInfo:
        """Store ``state`` as the new head of ``thread_id`` (see ``CheckpointStore.save``).
        Many tasks may save to one thread at once: every save lands, each on the head before
        it (compare-and-swap)."""
        async with self._core.turns.ahold(thread_id):  # (this loop's saves to it take turns)
            return await self._run(self._core.save(thread_id, state, label=label, tags=tags,
                                                   metadata=metadata,
                                                   expected_head=expected_head, status=status,
                                                   kind=kind, reason=reason,
                                                   keep_last=keep_last),
                                   offload=True)  # encoding and hashing off the loop

    # --- reading ---

    async def load(self, thread_id: str,
                   checkpoint_id: CheckpointId | None = None) -> Checkpoint:
        """The head of ``thread_id``, or one of its checkpoints by id."""
        return await self._run(self._core.load(thread_id, checkpoint_id))

    async def get(self, checkpoint_id: CheckpointId) -> Checkpoint:
        """Any checkpoint by id alone, whatever its thread."""
        return await self._run(self._core.get(checkpoint_id))

    async def diff(self, a_id: CheckpointId, b_id: CheckpointId) -> StateDiff:
        """What changed from checkpoint ``a_id`` to ``b_id`` (see ``CheckpointStore.diff``)."""
        return await self._run(diff_step(self._core, a_id, b_id))

    async def read_part(self, thread_id: str, checkpoint_id: CheckpointId | None = None,
                        path: Sequence[Any] = (), *, start: int = 0,
                        count: int = 100) -> StatePart:
        """One part of a checkpoint's state, read without the rest (see
        ``CheckpointStore.read_part``)."""
        return await self._run(part_step(self._core, thread_id, checkpoint_id, path, start,
                                         count))

    async def search(self, query: str, *, regex: bool = False, thread_id: str | None = None,
                     all_history: bool = False, limit: int | None = None,
                     progress: Callable[[int, int], object] | None = None,
                     checkpoint_id: CheckpointId | None = None) -> SearchResult:
        """Str values matching ``query`` (see ``CheckpointStore.search``)."""
        return await self._run(search_step(self._core, query, regex=regex, thread_id=thread_id,
                                           all_history=all_history, limit=limit,
                                           progress=progress, checkpoint_id=checkpoint_id))

    def history(self, thread_id: str, *, limit: int | None = None,
                before: CheckpointId | None = None, kind: str | Iterable[str] | None = None,
                status: str | Iterable[str] | None = None) -> Listing:
        """Checkpoints of a thread, newest first, without states: ``await`` it for a list, or
        ``async for`` over it (``kind``/``status`` filter: see ``CheckpointStore.history``)."""
        return Listing(lambda: self._run(self._core.history(thread_id, limit=limit,
                                                            before=before, kind=kind,
                                                            status=status)))

    def find(self, thread_id: str, *, label: str | None = None, tag: str | None = None,
             metadata: Mapping[str, Any] | None = None, status: str | Iterable[str] | None = None,
             kind: str | Iterable[str] | None = None) -> Listing:
        """Checkpoints (newest first) with this label, this tag, these metadata values, this
        status and this kind: ``await`` it or ``async for`` over it."""
        return Listing(lambda: self._run(self._core.find(thread_id, label=label, tag=tag,
                                                         metadata=metadata, status=status,
                                                         kind=kind)))

    async def threads(self) -> list[str]:
        """Every thread in the store, sorted."""
        return await self._run(self._core.threads())

    async def iter_threads(self) -> AsyncIterator[str]:
        """Every thread, unsorted, a page of the listing at a time (see
        ``CheckpointStore.iter_threads``)."""
        async for page in self.backend.alist_pages(HEADS):
            for thread in await self._run(self._core.refs.threads_in(page)):
                yield thread

    async def count(self, thread_id: str) -> int:
        """Number of checkpoints in a thread (from its head alone)."""
        return await self._run(self._core.count(thread_id))

    async def head(self, thread_id: str) -> CheckpointId | None:
        """The head checkpoint id of a thread, or None if the thread does not exist."""
        return await self._run(self._core.head(thread_id))

    # --- history edits ---

    async def fork(self, thread_id: str, checkpoint_id: CheckpointId,
                   new_thread_id: str) -> CheckpointInfo:
        """Start ``new_thread_id`` at a checkpoint of ``thread_id``; no state is copied."""
        return await self._run(self._core.fork(thread_id, checkpoint_id, new_thread_id))

    async def rewind(self, thread_id: str, checkpoint_id: CheckpointId, *,
                     expected_head: CheckpointId | None | Unset = UNSET) -> CheckpointInfo:
        """Move the head back to a checkpoint; checkpoints added after it leave the thread."""
        return await self._run(self._core.rewind(thread_id, checkpoint_id,
                                                 expected_head=expected_head))

    async def delete(self, thread_id: str, *checkpoint_ids: CheckpointId,
                     expected_head: CheckpointId | None | Unset = UNSET) -> None:
        """Remove these checkpoints from a thread in one compare-and-swap (see
        ``CheckpointStore.delete``)."""
        await self._run(self._core.delete(thread_id, *checkpoint_ids,
                                          expected_head=expected_head))

    async def delete_thread(self, thread_id: str) -> None:
        """Remove a thread's ref; its objects stay until gc."""
        await self._run(self._core.delete_thread(thread_id))

    # --- audit, retention, gc ---

    async def verify(self, *, deep: bool = True, sample: float | None = None,
                     thread_id: str | None = None,
                     progress: Progress | None = None) -> VerifyReport:
        """Audit the store (see ``CheckpointStore.verify``)."""
        return await self._run(self._upkeep.verify(deep=deep, sample=sample,
                                                 thread_id=thread_id, progress=progress))

    async def prune(self, thread_id: str | None = None, *, keep_last: int | None = None,
                    older_than: timedelta | None = None, keep_labeled: bool = True,
                    keep_tags: Iterable[str] = (), dry_run: bool = False) -> PruneReport:
        """Drop checkpoints from threads' logs (see ``CheckpointStore.prune``)."""
        return await self._run(self._upkeep.prune(thread_id, keep_last=keep_last,
                                                older_than=older_than, keep_labeled=keep_labeled,
                                                keep_tags=keep_tags, dry_run=dry_run))

    async def expire(self, *, idle_for: timedelta, dry_run: bool = False,
                     keep_labeled: bool = False, keep_tags: Iterable[str] = (),
                     thread_id: str | None = None,
                     group: Callable[[str], str | None] | None = None) -> ExpireReport:
        """Delete the refs of idle threads (see ``CheckpointStore.expire``)."""
        return await self._run(self._upkeep.expire(idle_for=idle_for, dry_run=dry_run,
                                                   keep_labeled=keep_labeled,
                                                   keep_tags=keep_tags, thread_id=thread_id,
                                                   group=group))

    async def repack(self, thread_id: str | None = None, *, min_garbage: float = 0.25,
                     dry_run: bool = False) -> RepackReport:
        """Rewrite packs that hold mostly garbage (see ``CheckpointStore.repack``)."""
        return await self._run(self._upkeep.repack(thread_id, min_garbage=min_garbage,
                                                 dry_run=dry_run))

    async def gc(self, *, grace: timedelta = timedelta(hours=1), dry_run: bool = False,
                 progress: gcmod.GCProgress | None = None, force: bool = False,
                 repack: bool = False, min_garbage: float = 0.25,
                 from_marks: bool = False) -> gcmod.GCReport:
        """Delete what no ref reaches, older than ``grace`` (see ``CheckpointStore.gc``)."""
        return await self._run(self._upkeep.gc(grace=grace, dry_run=dry_run, progress=progress,
                                             force=force, repack=repack,
                                             min_garbage=min_garbage, from_marks=from_marks))

    async def gc_mark(self, *, shard: int, of: int) -> gc_marks.MarkReport:
        """gc's reading work for one share of the refs (see ``CheckpointStore.gc_mark``)."""
        return await self._run(self._upkeep.gc_mark(shard=shard, of=of))

    # --- moving threads between stores ---

    async def export_thread(self, thread_id: str, dest: bundle.Dest, *,
                            progress: bundle.Progress | None = None) -> bundle.BundleReport:
        """Write a thread and everything it reaches into a bundle (see
        ``CheckpointStore.export_thread``); file writes run on the backend's thread pool."""
        return await self._run(bundle.export_step(self._core, thread_id, dest, progress))

    async def import_bundle(self, src: bundle.Dest, *, as_thread: str | None = None,
                            progress: bundle.Progress | None = None) -> bundle.BundleReport:
        """Read a bundle into this store (see ``CheckpointStore.import_bundle``)."""
        return await self._run(bundle.import_step(self._core, src, as_thread, progress))

    # --- sizes ---

    async def settings(self) -> dict[str, Any]:
        """``CheckpointStore.settings``."""
        got = await self._run(self._core.objects.current())
        return {"compression": got.compression, "compression_level": got.level,
                "encryption": got.encryption, "key_id": got.key_id}

    async def rekey(self) -> dict[str, Any]:
        """``CheckpointStore.rekey``."""
        backend = self.backend
        if not isinstance(backend, sealed.SealedBackend):
            raise InvalidArgumentError("rekey needs an encrypted store opened with its keys: "
                                       "AsyncCheckpointStore.open(url, encryption=[new, old])")
        self._core._known.clear()
        return await self._run(rotation.rekey(self._core.refs, backend))

    async def storage_bytes(self) -> int:
        """Bytes stored under the root (packs and refs)."""
        return await self._run(self._upkeep.storage_bytes())

    async def stats(self, *, by_thread: bool = False) -> StoreStats:
        """Logical against physical bytes, and per thread with ``by_thread=True`` (see
        ``CheckpointStore.stats``)."""
        return await self._run(self._upkeep.stats(by_thread))


async def acopy_threads(src: AsyncCheckpointStore, dst: AsyncCheckpointStore,
                        threads: Iterable[str] | None = None, *,
                        progress: CopyProgress | None = None) -> CopyReport:
    """``copy_threads`` between two ``AsyncCheckpointStore``s (opened on this loop)."""
    s, d = copy.cores(src, dst, AsyncCheckpointStore)
    return await arun(copy.copy_step(s, d, threads, progress), d.backend)
