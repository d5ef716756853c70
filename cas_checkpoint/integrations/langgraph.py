"""``CasSaver``: a LangGraph checkpointer over a cas_checkpoint store.

    from cas_checkpoint.integrations.langgraph import CasSaver
    saver = CasSaver.from_url("s3://bucket/agents")      # or CasSaver(CheckpointStore.open(...))
    graph = builder.compile(checkpointer=saver)

How LangGraph's model maps onto the store (``pip install 'cas_checkpoint[langgraph]'``):

* each ``(thread_id, checkpoint_ns)`` is a store thread named ``lg:["<thread_id>","<ns>"]``; its
  checkpoints are LangGraph's, in the order they were put. A checkpoint's state is LangGraph's
  checkpoint dict itself, so ``channel_values["messages"]`` is a list whose unchanged messages are
  shared with the checkpoint before (one more message costs about one message of storage), and a
  channel whose value did not change is the same objects. LangGraph's id, parent id and metadata
  are the record's metadata: history, ``list(filter=...)`` and ``before`` read no state.
* pending writes are entries of the same store thread, one per ``put_writes`` call (LangGraph's
  checkpoint id and the task id in their metadata, no parent), so a message a node wrote and the
  next checkpoint holds is stored once. On read, a regular
  write ``(task_id, idx)`` keeps its first value and a special one (``__error__``,
  ``__interrupt__``, ``__resume__``, ``__scheduled__``) its last, returned in ``writes_sort_key``
  order, as LangGraph's own savers do.
* values are encoded by cas_checkpoint's codec, never by pickle: only LangChain messages and
  documents, LangGraph's ``Send``/``Command``/``Interrupt``/``Overwrite``, the codec's own safe
  types, the ``types=`` you pass and those LangGraph names through ``with_allowlist`` are ever
  constructed; anything else is a ``SerializationError`` on save and a ``FormatError`` on load.
* two processes writing one thread both land (compare-and-swap), each checkpoint with the parent
  LangGraph gave it.

Every method is one step (``cas_checkpoint.ops``), run by the sync methods with blocking calls
and by the ``a``-methods on the event loop: one implementation, two faces.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import sys
import weakref
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    PendingWrite,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
    writes_sort_key,
)

from ..backends import Backend, open_backend_async
from ..codec import TypeRegistry
from ..core import Core
from ..errors import ConflictError, InvalidArgumentError, NotFoundError
from ..heads import Head
from ..model import CheckpointInfo
from ..objects import CheckpointId
from ..ops import Step, arun, run
from ..store import CheckpointStore

log = logging.getLogger("cas_checkpoint")

PREFIX = "lg:"
RECENT = 16  # entries a put looks through for its parent before reading the whole log


def default_types() -> TypeRegistry:
    """LangChain messages and documents, LangGraph's Send/Command/Interrupt/Overwrite."""
    reg = TypeRegistry()
    from langchain_core import messages as m

    for name in ("AIMessage", "AIMessageChunk", "HumanMessage", "HumanMessageChunk",
                 "SystemMessage", "SystemMessageChunk", "ChatMessage", "ChatMessageChunk",
                 "ToolMessage", "ToolMessageChunk", "FunctionMessage", "FunctionMessageChunk",
                 "RemoveMessage"):
        reg.register(getattr(m, name))
    try:
        from langchain_core.documents import Document

        reg.register(Document)
    except ImportError:  # pragma: no cover
        pass
    from langgraph import types as lt

    reg.register(lt.Send, to_data=lambda s: [s.node, s.arg],
                 from_data=lambda d: lt.Send(*_pair(d, "Send")))
    for name in ("Command", "Interrupt"):
        reg.register(getattr(lt, name))
    overwrite = getattr(lt, "Overwrite", None)
    if isinstance(overwrite, type):
        _register_any(reg, overwrite)
    try:
        from langgraph.checkpoint.serde.types import _DeltaSnapshot

        reg.register(_DeltaSnapshot, to_data=lambda s: list(s),
                     from_data=lambda d: _DeltaSnapshot(*_items(d, "_DeltaSnapshot")))
    except ImportError:  # pragma: no cover - an older langgraph-checkpoint
        pass
    return reg


def _pair(data: Any, what: str) -> tuple[Any, Any]:
    if type(data) is not list or len(data) != 2:
        from ..errors import FormatError

        raise FormatError(f"invalid stored {what}: expected [node, arg]")
    return data[0], data[1]


def _items(data: Any, what: str) -> list[Any]:
    if type(data) is not list:
        from ..errors import FormatError

        raise FormatError(f"invalid stored {what}")
    return data


def _register_any(reg: TypeRegistry, cls: type) -> bool:
    """Register a class of a kind the codec stores (dataclass, pydantic model, enum)."""
    try:
        reg.register(cls)
        return True
    except InvalidArgumentError:
        return False


def _key(thread_id: str, ns: str) -> str:
    return PREFIX + json.dumps([thread_id, ns], ensure_ascii=False, separators=(",", ":"))


def _parse(name: str) -> tuple[str, str] | None:
    """(thread_id, ns) of a store thread of this saver's, else None."""
    if not name.startswith(PREFIX):
        return None
    try:
        got = json.loads(name[len(PREFIX):])
    except ValueError:
        return None
    if type(got) is list and len(got) == 2 and type(got[0]) is str and type(got[1]) is str:
        return got[0], got[1]
    return None


def _config(thread_id: str, ns: str, cid: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}}


def _target(config: RunnableConfig) -> tuple[str, str]:
    conf = config.get("configurable") or {}
    thread_id = conf.get("thread_id")
    if thread_id is None:
        raise InvalidArgumentError("the config has no configurable.thread_id; pass "
                                   "{'configurable': {'thread_id': ...}}")
    return str(thread_id), str(conf.get("checkpoint_ns", "") or "")


class CasSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer storing into a cas_checkpoint store (see the module docs)."""

    def __init__(self, store: CheckpointStore, *, types: Iterable[type] = (),
                 conflicts: str = "keep") -> None:
        """``conflicts="keep"`` (the default): when two writers put checkpoints on one thread,
        both are kept, each with the parent LangGraph gave it. ``"raise"``: a put whose parent
        is not the thread's latest checkpoint raises ``ConflictError`` (checked inside the
        compare-and-swap), so a second writer of a thread fails instead of branching it; in
        this mode replaying from a past checkpoint raises too (fork into a new thread with
        ``copy_thread`` instead)."""
        super().__init__()
        if conflicts not in ("keep", "raise"):
            raise InvalidArgumentError(f"conflicts must be 'keep' or 'raise', not {conflicts!r}")
        self.conflicts = conflicts
        if not isinstance(store, CheckpointStore):
            raise InvalidArgumentError("CasSaver needs a cas_checkpoint.CheckpointStore; use "
                                       "CasSaver.from_url(url) to open one")
        reg = default_types()
        for cls in store.types._by_class:
            _register_any(reg, cls)
        for cls in types:
            reg.register(cls)
        self.store = store
        self._core = Core(store.backend, reg, None)
        self._core.objects.wanted = store._core.objects.wanted  # the store's compression
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Backend] = (
            weakref.WeakKeyDictionary())

    @classmethod
    def from_url(cls, url: str, *, storage_options: Mapping[str, Any] | None = None,
                 types: Iterable[type] = (), conflicts: str = "keep",
                 **open_kw: Any) -> CasSaver:
        """Open (creating if needed) the store at ``url`` (a path, ``memory://``, ``s3://``;
        ``open_kw`` as for ``CheckpointStore.open``) and a saver over it."""
        return cls(CheckpointStore.open(url, storage_options=storage_options, **open_kw),
                   types=types, conflicts=conflicts)

    # --- drivers -----------------------------------------------------------------------------

    def _run(self, step: Step[Any]) -> Any:
        return run(step, self._core.backend)

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
        for cls, entry in self._core.types._by_class.items():
            reg.register(cls, entry.name, to_data=entry.to_data, from_data=entry.from_data)
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
        clone._core = Core(self._core.backend, reg, None)
        return clone

    # --- steps -------------------------------------------------------------------------------

    def _all(self, name: str) -> Step[list[CheckpointInfo]]:
        """A store thread's entries (metadata only), newest first; [] if it does not exist."""
        try:
            got: list[CheckpointInfo] = yield from self._core.history(name)
        except NotFoundError:
            return []
        return got

    def _entries(self, name: str, every: list[CheckpointInfo] | None = None
                 ) -> Step[list[CheckpointInfo]]:
        """LangGraph's checkpoints in a store thread (not its writes), newest first (of
        ``every``, its entries as ``_all`` gives them, when the caller read them already)."""
        return [e for e in (every if every is not None else (yield from self._all(name)))
                if "lg" in e.metadata]

    def _find(self, name: str, lg: str) -> Step[CheckpointInfo | None]:
        """The entry of LangGraph checkpoint ``lg``: among the recent entries first (they are in
        the thread's ref: no pack read), then the whole log."""
        recent: list[CheckpointInfo] = []
        for cached in (True, False):  # the ref this process last wrote, else the stored one
            try:
                recent = yield from self._core.history(name, limit=RECENT, cached=cached)
            except NotFoundError:
                return None
            found = next((e for e in recent if e.metadata.get("lg") == lg), None)
            if found is not None:
                return found
        if len(recent) == RECENT:
            found = next((e for e in (yield from self._entries(name))
                          if e.metadata.get("lg") == lg), None)
        return found

    def _names(self, thread_id: str | None = None) -> Step[list[tuple[str, str, str]]]:
        """(store name, thread_id, ns) of this saver's threads (of one thread_id)."""
        out = []
        for name in (yield from self._core.threads()):
            got = _parse(name)
            if got is not None and (thread_id is None or got[0] == thread_id):
                out.append((name, *got))
        return out

    def _put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
             new_versions: ChannelVersions) -> Step[RunnableConfig]:
        thread_id, ns = _target(config)
        parent = get_checkpoint_id(config)
        name = _key(thread_id, ns)
        meta = {"lg": checkpoint["id"], "lgp": parent,
                "m": get_serializable_checkpoint_metadata(config, metadata)}
        parents: tuple[CheckpointId, ...] | None = None
        if parent is not None:  # LangGraph's parent, which need not be the head (time travel)
            found = yield from self._find(name, parent)
            parents = (found.id,) if found is not None else ()
        check = None
        if self.conflicts == "raise":
            def check(head: Head) -> Step[None]:
                latest = None
                for entry in (yield from self._core.refs.newest_first(head)):
                    if "lg" in entry.metadata:
                        latest = entry.metadata["lg"]
                        break
                if latest != parent:
                    raise ConflictError(name, parent, latest)
        yield from self._core.save(name, dict(checkpoint), metadata=meta, parents=parents,
                                   check=check)
        return _config(thread_id, ns, checkpoint["id"])

    def _put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                    task_id: str, task_path: str) -> Step[None]:
        thread_id, ns = _target(config)
        cid = get_checkpoint_id(config)
        if cid is None:
            raise InvalidArgumentError("put_writes needs configurable.checkpoint_id")
        items = [[WRITES_IDX_MAP.get(channel, idx), channel, value]
                 for idx, (channel, value) in enumerate(writes)]
        if not items:
            return
        state = {"task": task_id, "path": task_path, "writes": items}
        yield from self._core.save(_key(thread_id, ns), state,
                                   metadata={"w": cid, "task": task_id}, parents=())

    def _writes(self, thread_id: str, ns: str, cids: set[str] | None,
                every: list[CheckpointInfo] | None = None) -> Step[dict[str, list[PendingWrite]]]:
        """Pending writes per LangGraph checkpoint id (of ``cids``, or all), deduplicated as
        LangGraph's savers do and in ``writes_sort_key`` order (found in ``every``, the
        thread's entries, when the caller read them already: a long log is read once)."""
        name = _key(thread_id, ns)
        entries = every if every is not None else (yield from self._all(name))
        wanted = [e for e in reversed(entries)
                  if "w" in e.metadata and (cids is None or e.metadata["w"] in cids)]
        per: dict[str, dict[tuple[str, int], tuple[str, str, Any, str]]] = {}
        loaded = yield from self._core.load_many(name, [e.id for e in wanted])
        for entry in wanted:  # oldest first
            state, target = loaded[entry.id].state, str(entry.metadata["w"])
            got = per.setdefault(target, {})
            for idx, channel, value in state["writes"]:
                key = (state["task"], idx)
                if idx >= 0 and key in got:
                    continue  # a regular write keeps its first value
                got[key] = (state["task"], channel, value, state["path"])
        return {cp: [(w[0], w[1], w[2]) for k, w in sorted(
            got.items(), key=lambda kv: writes_sort_key(kv[1][3], *kv[0]))]
            for cp, got in per.items()}

    @staticmethod
    def _tuple(thread_id: str, ns: str, info: CheckpointInfo, state: Any,
               writes: list[PendingWrite]) -> CheckpointTuple:
        lg, parent = info.metadata["lg"], info.metadata.get("lgp")
        meta = cast(CheckpointMetadata, dict(info.metadata["m"]))
        return CheckpointTuple(_config(thread_id, ns, lg), state, meta,
                               _config(thread_id, ns, parent) if parent else None, writes)

    def _get_tuple(self, config: RunnableConfig) -> Step[CheckpointTuple | None]:
        thread_id, ns = _target(config)
        cid = get_checkpoint_id(config)
        every = yield from self._all(_key(thread_id, ns))
        entries = yield from self._entries(_key(thread_id, ns), every)
        if cid is None:
            info = max(entries, key=lambda e: str(e.metadata.get("lg")), default=None)
        else:
            info = next((e for e in entries if e.metadata.get("lg") == cid), None)
        if info is None:
            return None
        lg = str(info.metadata["lg"])
        writes = yield from self._writes(thread_id, ns, {lg}, every)
        loaded = yield from self._core.load_many(_key(thread_id, ns), [info.id])
        return self._tuple(thread_id, ns, info, loaded[info.id].state, writes.get(lg, []))

    def _list(self, config: RunnableConfig | None, filter: dict[str, Any] | None,
              before: RunnableConfig | None, limit: int | None) -> Step[list[CheckpointTuple]]:
        conf = (config or {}).get("configurable") or {}
        want_thread = conf.get("thread_id")
        want_ns = conf.get("checkpoint_ns")
        want_id = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        out: list[CheckpointTuple] = []
        names = yield from self._names(None if want_thread is None else str(want_thread))
        for _name, thread_id, ns in sorted(names, key=lambda n: (n[1], n[2])):
            if want_ns is not None and ns != want_ns:
                continue
            every = yield from self._all(_key(thread_id, ns))
            entries = yield from self._entries(_key(thread_id, ns), every)
            chosen: list[CheckpointInfo] = []
            for info in sorted(entries, key=lambda e: str(e.metadata.get("lg")), reverse=True):
                lg = str(info.metadata.get("lg"))
                if (want_id and lg != want_id) or (before_id and lg >= before_id):
                    continue
                meta = info.metadata.get("m") or {}
                if filter and not all(meta.get(k) == v for k, v in filter.items()):
                    continue
                if limit is not None and len(out) + len(chosen) >= limit:
                    break
                chosen.append(info)
            if not chosen:
                continue
            writes = yield from self._writes(thread_id, ns,
                                             {str(i.metadata["lg"]) for i in chosen}, every)
            loaded = yield from self._core.load_many(_key(thread_id, ns), [i.id for i in chosen])
            out += [self._tuple(thread_id, ns, info, loaded[info.id].state,
                                writes.get(str(info.metadata["lg"]), [])) for info in chosen]
            if limit is not None and len(out) >= limit:
                break
        return out

    def _delete_thread(self, thread_id: str) -> Step[None]:
        for name, *_ in (yield from self._names(str(thread_id))):
            try:
                yield from self._core.delete_thread(name)
            except NotFoundError:
                pass

    def _copy_thread(self, source: str, target: str) -> Step[None]:
        for name, _t, ns in (yield from self._names(str(source))):
            new = _key(str(target), ns)
            try:
                yield from self._core.copy(name, new)
            except NotFoundError:
                pass

    def _retain(self, thread_id: str, ns: str, keep: set[str]) -> Step[None]:
        """Keep only the checkpoints with these LangGraph ids (and their writes)."""
        name = _key(thread_id, ns)
        entries = yield from self._all(name)
        kept = {e.id for e in entries if (e.metadata.get("lg") or e.metadata.get("w")) in keep}
        if len(kept) == len(entries):
            return
        if not kept:
            yield from self._core.delete_thread(name)
        else:
            yield from self._core.retain(name, kept)

    def _prune(self, thread_ids: Sequence[str], strategy: str) -> Step[None]:
        if strategy not in ("keep_latest", "delete"):
            raise InvalidArgumentError(f"unknown prune strategy {strategy!r}: use "
                                       "'keep_latest' or 'delete'")
        for thread_id in thread_ids:
            if strategy == "delete":
                yield from self._delete_thread(thread_id)
                continue
            for _name, _t, ns in (yield from self._names(str(thread_id))):
                keep = yield from self._needed(str(thread_id), ns)
                yield from self._retain(str(thread_id), ns, keep)

    def _needed(self, thread_id: str, ns: str) -> Step[set[str]]:
        """The latest checkpoint, and the ancestors it needs: while a channel it versions has
        no value in it (a DeltaChannel between snapshots), walk up to the nearest ancestor that
        holds one."""
        name = _key(thread_id, ns)
        entries = yield from self._entries(name)
        by_lg = {str(e.metadata.get("lg")): e for e in entries}
        if not by_lg:
            return set()
        latest = by_lg[max(by_lg)]
        cp = yield from self._core.load(name, latest.id)
        missing = set(cp.state.get("channel_versions", {})) - set(cp.state.get(
            "channel_values", {}))
        keep = {str(latest.metadata["lg"])}
        parent = latest.metadata.get("lgp")
        while missing and parent in by_lg and parent not in keep:
            keep.add(parent)
            info = by_lg[parent]
            state = (yield from self._core.load(name, info.id)).state
            missing -= set(state.get("channel_values", {}))
            parent = info.metadata.get("lgp")
        return keep

    def _delete_for_runs(self, run_ids: Sequence[str]) -> Step[None]:
        runs = set(run_ids)
        if not runs:
            return
        for _name, thread_id, ns in (yield from self._names()):
            entries = yield from self._entries(_key(thread_id, ns))
            keep = {str(e.metadata.get("lg")) for e in entries
                    if (e.metadata.get("m") or {}).get("run_id") not in runs}
            if len(keep) < len(entries):
                yield from self._retain(thread_id, ns, keep)

    def _delta_history(self, config: RunnableConfig, channels: Sequence[str]
                       ) -> Step[dict[str, DeltaChannelHistory]]:
        if not channels:
            return {}
        thread_id, ns = _target(config)
        name = _key(thread_id, ns)
        every = yield from self._all(name)
        by_lg = {str(e.metadata.get("lg")): e for e in (yield from self._entries(name, every))}
        cid = get_checkpoint_id(config) or (max(by_lg) if by_lg else None)
        target = by_lg.get(cid or "")
        collected: dict[str, list[PendingWrite]] = {c: [] for c in channels}
        seeds: dict[str, Any] = {}
        remaining = set(channels)
        chain = []
        cursor = target.metadata.get("lgp") if target else None
        while cursor in by_lg and cursor not in chain:
            chain.append(cursor)
            cursor = by_lg[cursor].metadata.get("lgp")
        writes = (yield from self._writes(thread_id, ns, set(chain), every)) if chain else {}
        states: dict[CheckpointId, Any] = {}
        for n, lg in enumerate(chain):  # one walk up the parent chain, newest first
            if not remaining:
                break
            for write in reversed(writes.get(lg, [])):
                if write[1] in remaining:
                    collected[write[1]].append(write)
            if by_lg[lg].id not in states:  # the chain's states, a batch at a time
                batch = [by_lg[x].id for x in chain[n:n + RECENT]]
                states.update((yield from self._core.load_many(name, batch)))
            values = states[by_lg[lg].id].state["channel_values"]
            for ch in list(remaining):
                if ch in values:
                    seeds[ch] = values[ch]
                    remaining.discard(ch)
        out: dict[str, DeltaChannelHistory] = {}
        for ch in channels:
            entry: DeltaChannelHistory = {"writes": list(reversed(collected[ch]))}
            if ch in seeds:
                entry["seed"] = seeds[ch]
            out[ch] = entry
        return out

    # --- the sync face -----------------------------------------------------------------------

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        with self._core.turns.hold(_key(*_target(config))):  # (LangGraph calls from a pool)
            return self._run(self._put(config, checkpoint, metadata, new_versions))  # type: ignore[no-any-return]

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        with self._core.turns.hold(_key(*_target(config))):
            self._run(self._put_writes(config, writes, task_id, task_path))

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._run(self._get_tuple(config))  # type: ignore[no-any-return]

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None
             ) -> Iterator[CheckpointTuple]:
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
        async with self._core.turns.ahold(_key(*_target(config))):
            return await self._arun(self._put(config, checkpoint, metadata, new_versions))  # type: ignore[no-any-return]

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        async with self._core.turns.ahold(_key(*_target(config))):
            await self._arun(self._put_writes(config, writes, task_id, task_path))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._arun(self._get_tuple(config))  # type: ignore[no-any-return]

    async def alist(self, config: RunnableConfig | None, *,
                    filter: dict[str, Any] | None = None, before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
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
        return await self._arun(self._delta_history(config, channels))  # type: ignore[no-any-return]
