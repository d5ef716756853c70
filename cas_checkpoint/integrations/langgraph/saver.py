"""``CasSaver``: the LangGraph checkpointer, its drivers and its sync and async faces (see
the package's docs)."""

from __future__ import annotations

import asyncio
import copy
import logging
import random
import sys
import weakref
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)

from cas_checkpoint.backends import Backend, open_backend_async
from cas_checkpoint.engine.commit import Part
from cas_checkpoint.engine.steps import Step, arun, run
from cas_checkpoint.errors import CasError, InvalidArgumentError
from cas_checkpoint.format.codec import TypeRegistry
from cas_checkpoint.format.objects import LogEntry
from cas_checkpoint.integrations.langgraph.encode import PutEncoder
from cas_checkpoint.integrations.langgraph.group import Groups, SyncGroups
from cas_checkpoint.integrations.langgraph.keys import _key, _parse, _target
from cas_checkpoint.integrations.langgraph.registry import _register_any, saver_registry, set_hooks
from cas_checkpoint.integrations.langgraph.schemas import Learned
from cas_checkpoint.integrations.langgraph.steps import RECENT
from cas_checkpoint.integrations.langgraph.ttl import ttl_of
from cas_checkpoint.integrations.langgraph.walks import Walks
from cas_checkpoint.integrations.langgraph_threads import thread_of
from cas_checkpoint.maintenance.expire import ExpireReport
from cas_checkpoint.maintenance.upkeep import Maintenance
from cas_checkpoint.store import CheckpointStore, engine_for

log = logging.getLogger("cas_checkpoint")
# New objects a thread's head holds before they go to a pack (the store's default is 4 KB). A
# LangGraph step's commit adds ~3.5 KB (its channel versions and the state's root node), so at
# 4 KB nearly every commit wrote a pack: two more flushes on local disk (the pack's bytes and
# its folder entry) and one more PUT on S3. At 16 KB about four commits share one: a turn of
# the agent benchmark makes ~35 flushes, not ~49 (AsyncSqliteSaver: ~40), for a head up to
# 12 KB bigger. Readers take any size (a head is bounded by its 4 MB only).
INLINE_BYTES = 16 * 1024
__all__ = ["RECENT", "CasSaver"]


class CasSaver(Walks, BaseCheckpointSaver[str]):
    """A LangGraph checkpointer storing into a cas_checkpoint store (see the module docs)."""

    def __init__(self, store: CheckpointStore, *, types: Iterable[type] = (),
                 conflicts: str = "keep", unregistered: str = "data", shallow: bool = False,
                 ttl: Mapping[str, Any] | timedelta | None = None) -> None:
        """``conflicts="keep"`` (the default): when two writers put checkpoints on one thread,
        both are kept, each with the parent LangGraph gave it. ``"raise"``: a put whose parent
        is not the thread's latest checkpoint raises ``ConflictError`` (checked inside the
        compare-and-swap), so a second writer of a thread fails instead of branching it; in
        this mode replaying from a past checkpoint raises too (fork into a new thread with
        ``copy_thread`` instead).

        ``unregistered="data"`` (the default, as LangGraph's strict mode): a dataclass, pydantic
        model or enum member whose class this saver was not given (``types=``, LangGraph's
        ``with_allowlist``, the calling graph's own schemas) is stored as its data and comes
        back as that data (a dict; a warning names the ``types=`` fix). ``"raise"``: it is
        refused on put (``SerializationError``) and on load (``FormatError``).

        ``shallow=True`` keeps only each namespace's latest checkpoint and its pending writes,
        dropped in each put's own compare-and-swap (as LangGraph's shallow savers do:
        ``get_state_history`` returns one checkpoint); a graph with DeltaChannels also keeps
        the ancestors down to their snapshots. gc then reclaims the rest.

        ``ttl``: a thread none of whose namespaces was saved to for that long expires (its refs
        are deleted; gc reclaims its bytes). LangGraph's settings as they are
        (``{"default_ttl": MINUTES, "sweep_interval_minutes": MINUTES, "strategy": "delete"}``)
        or a ``timedelta``. ``sweep()`` expires now; with ``sweep_interval_minutes`` a put
        sweeps when that long has passed since this saver's last sweep."""
        super().__init__()
        if not isinstance(shallow, bool):
            raise InvalidArgumentError(f"shallow must be True or False, not {shallow!r}")
        self.shallow = shallow
        self.ttl = ttl_of(ttl)
        if unregistered not in ("data", "raise"):
            raise InvalidArgumentError("unregistered must be 'data' or 'raise', not "
                                       f"{unregistered!r}")
        self.unregistered = unregistered
        self._learned = Learned()
        if conflicts not in ("keep", "raise"):
            raise InvalidArgumentError(f"conflicts must be 'keep' or 'raise', not {conflicts!r}")
        self.conflicts = conflicts
        if not isinstance(store, CheckpointStore):
            raise InvalidArgumentError("CasSaver needs a cas_checkpoint.CheckpointStore; use "
                                       "CasSaver.from_url(url) to open one")
        reg = saver_registry(objects=unregistered == "data")
        for cls in store.types.classes():
            _register_any(reg, cls)
        for cls in types:
            reg.register(cls)
        self.store = store
        self._core = engine_for(store, reg)
        self._core.refs.inline_max = INLINE_BYTES
        self._encoder = PutEncoder()  # the encodings of each thread's last put (encode.py)
        self._groups = Groups(self._core)  # the async face's group commits (group.py)
        self._sync = SyncGroups()  # and the sync face's
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Backend] = (
            weakref.WeakKeyDictionary())

    @classmethod
    def from_url(cls, url: str, *, storage_options: Mapping[str, Any] | None = None,
                 types: Iterable[type] = (), conflicts: str = "keep",
                 unregistered: str = "data", shallow: bool = False,
                 ttl: Mapping[str, Any] | timedelta | None = None, **open_kw: Any) -> CasSaver:
        """Open (creating if needed) the store at ``url`` (a path, ``memory://``, ``s3://``;
        ``open_kw`` as for ``CheckpointStore.open``) and a saver over it."""
        return cls(CheckpointStore.open(url, storage_options=storage_options, **open_kw),
                   types=types, conflicts=conflicts, unregistered=unregistered,
                   shallow=shallow, ttl=ttl)

    # --- drivers -----------------------------------------------------------------------------

    def _run(self, step: Step[Any]) -> Any:
        return run(step, self._core.backend)

    def _sync_commit(self, name: str, parts: list[Part]) -> list[LogEntry | Exception]:
        parsed = _parse(name)
        return self._run(  # type: ignore[no-any-return]
            self._commit(name if parsed is None else parsed[0], name, parts))

    async def _arun(self, step: Step[Any]) -> Any:
        return await arun(step, await self._async_backend())

    async def _async_backend(self) -> Backend:
        """The backend the ``a``-methods await: for S3 opened without asyncio, one with an
        async s3fs session of its own per running event loop (its requests then are coroutines
        on that loop, not calls on a thread pool); the store's own backend otherwise."""
        backend = self._core.backend
        fs = getattr(backend, "fs", None)
        if fs is None or getattr(fs, "asynchronous", False) or not backend.url.startswith(
                "s3://"):
            return backend
        loop = asyncio.get_running_loop()
        got = self._loops.get(loop)
        if got is None:
            options = {k: v for k, v in fs.storage_options.items()
                       if k not in ("asynchronous", "loop", "skip_instance_cache")}
            got = await open_backend_async(backend.url, options,
                                           allow_unsafe=getattr(backend, "allow_unsafe", False))
            self._loops[loop] = got
        return got

    def with_allowlist(self, extra_allowlist: Iterable[tuple[str, ...]]
                       ) -> CasSaver:
        """A clone that may also construct these classes (``(module, qualname)`` pairs that
        LangGraph derives from a graph's state schema). Only classes already imported are
        resolved (nothing is imported by name), and only of the kinds the codec stores."""
        reg = TypeRegistry()
        set_hooks(reg, objects=self.unregistered == "data")
        reg.update(self._core.types)
        added = 0
        for item in extra_allowlist:
            if len(item) < 2:
                continue
            obj: Any = sys.modules.get(item[0])
            for part in item[1].split(".") if obj is not None else ():
                obj = getattr(obj, part, None)
            if isinstance(obj, type) and obj not in reg:
                added += _register_any(reg, obj)
        if not added:
            return self
        clone = copy.copy(self)
        clone._core = self._core.with_types(reg)
        clone._core.refs.inline_max = INLINE_BYTES
        clone._learned = Learned()  # its registry learns the graphs it is called from
        clone._encoder = PutEncoder()  # (encodings made with its own registry)
        clone._groups = Groups(clone._core)
        clone._sync = SyncGroups()
        return clone

    def get_next_version(self, current: Any, channel: None) -> Any:
        """The next version of a channel: an int after an int (this saver's own), and after a
        str in the format LangGraph's other savers write (InMemorySaver, SqliteSaver,
        PostgresSaver: ``"<32-digit counter>.<random fraction>"``) the next one in that format,
        so a thread copied from one of them resumes and its versions keep increasing."""
        if isinstance(current, str):
            head = current.split(".", 1)[0]
            if not (head.isascii() and head.isdigit()):
                raise InvalidArgumentError(
                    f"channel version {current[:80]!r} is not an int nor a str that starts "
                    "with a counter (as InMemorySaver, SqliteSaver and PostgresSaver write, "
                    "e.g. '00000000000000000000000000000002.0.5'); copy the thread with its "
                    "versions as that saver wrote them")
            return f"{int(head) + 1:032}.{random.random():016}"
        return super().get_next_version(current, channel)

    def _learn(self) -> None:
        """Register the classes of the calling graph's schemas (see ``schemas``)."""
        for cls in self._learned.new_classes():
            if cls not in self._core.types:
                _register_any(self._core.types, cls)

    # --- time-to-live ------------------------------------------------------------------------

    def _sweep(self, dry_run: bool) -> Step[ExpireReport]:
        """Expire the LangGraph threads none of whose namespaces is recent (each namespace by
        compare-and-swap: one saved to meanwhile stays)."""
        if self.ttl is None:
            raise InvalidArgumentError("this saver has no ttl; pass CasSaver(store, "
                                       "ttl={'default_ttl': MINUTES}) or ttl=timedelta(...)")
        return (yield from Maintenance(self._core).expire(
            idle_for=self.ttl.idle_for, dry_run=dry_run,
            only=lambda name: _parse(name) is not None, group=thread_of))

    def sweep(self, *, dry_run: bool = False) -> ExpireReport:
        """Expire the threads idle for the saver's ``ttl`` now (``report.expired`` names the
        store threads, one per namespace); run ``store.gc()`` after to reclaim their bytes."""
        return self._run(self._sweep(dry_run))  # type: ignore[no-any-return]

    async def asweep(self, *, dry_run: bool = False) -> ExpireReport:
        """``sweep``, awaited."""
        return await self._arun(self._sweep(dry_run))  # type: ignore[no-any-return]

    def _sweep_due(self) -> bool:
        return self.ttl is not None and self.ttl.due()

    # --- the sync face -----------------------------------------------------------------------

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        """(LangGraph calls from a pool: the saves of one thread in flight together share one
        commit, ``group.SyncGroups``; each is prepared under the thread's lock, in call order.)"""
        key = _key(*_target(config))
        with self._core.turns.hold(key):
            name, part, finish, tidy = self._run(self._put_part(config, checkpoint, metadata,
                                                                new_versions))
            call = self._sync.enqueue(name, part)
        out = finish(self._sync.wait(name, call, self._sync_commit))
        if tidy is not None:
            with self._core.turns.hold(key):
                self._run(tidy())
        if self._sweep_due():
            try:
                self.sweep()
            except CasError as exc:  # a sweep never fails the put it follows
                log.warning("ttl sweep failed (the next one retries): %s", exc)
        return out  # type: ignore[no-any-return]

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        with self._core.turns.hold(_key(*_target(config))):
            got = self._writes_part(config, writes, task_id, task_path)
            if got is None:
                return
            call = self._sync.enqueue(*got)
        self._sync.wait(got[0], call, self._sync_commit)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        self._learn()
        return self._run(self._get_tuple(config))  # type: ignore[no-any-return]

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None
             ) -> Iterator[CheckpointTuple]:
        self._learn()
        yield from self._run(self._list(config, filter, before, limit))

    def delete_thread(self, thread_id: str) -> None:
        self._run(self._delete_thread(thread_id))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._run(self._copy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._run(self._prune(thread_ids, strategy))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._run(self._delete_for_runs(run_ids))

    def get_delta_channel_history(self, *, config: RunnableConfig, channels: Sequence[str]
                                  ) -> Mapping[str, DeltaChannelHistory]:
        self._learn()
        return self._run(self._delta_history(config, channels))  # type: ignore[no-any-return]

    # --- the async face ----------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the S3 session the ``a``-methods opened for the running event loop (if any);
        call it before that loop ends (or use ``async with saver:``)."""
        got = self._loops.pop(asyncio.get_running_loop(), None)
        if got is not None:
            await got.aclose()

    async def __aenter__(self) -> CasSaver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        """(The puts and pending writes of one thread in flight together share one commit:
        ``group.py``.)"""
        backend = await self._async_backend()
        name, part, finish, tidy = await arun(self._put_part(config, checkpoint, metadata,
                                                             new_versions), backend)
        out = finish(await self._groups.save(name, part, backend))
        if tidy is not None:
            await arun(tidy(), backend)
        if self._sweep_due():
            try:
                await self.asweep()
            except CasError as exc:  # a sweep never fails the put it follows
                log.warning("ttl sweep failed (the next one retries): %s", exc)
        return out

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        got = self._writes_part(config, writes, task_id, task_path)
        if got is not None:
            await self._groups.save(*got, await self._async_backend(), lead=False)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        self._learn()
        return await self._arun(self._get_tuple(config))  # type: ignore[no-any-return]

    async def alist(self, config: RunnableConfig | None, *,
                    filter: dict[str, Any] | None = None, before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        self._learn()
        for item in await self._arun(self._list(config, filter, before, limit)):
            yield item

    async def adelete_thread(self, thread_id: str) -> None:
        await self._arun(self._delete_thread(thread_id))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._arun(self._copy_thread(source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._arun(self._prune(thread_ids, strategy))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._arun(self._delete_for_runs(run_ids))

    async def aget_delta_channel_history(self, *, config: RunnableConfig,
                                         channels: Sequence[str]
                                         ) -> Mapping[str, DeltaChannelHistory]:
        self._learn()
        return await self._arun(self._delta_history(config, channels))  # type: ignore[no-any-return]
