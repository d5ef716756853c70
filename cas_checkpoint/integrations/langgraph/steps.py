"""What CasSaver's reads and writes decide, as steps (``cas_checkpoint.ops``): one
implementation that the sync and the async face both run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

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

from ...core import Core
from ...errors import ConflictError, InvalidArgumentError, NotFoundError
from ...heads import Head
from ...model import CheckpointInfo
from ...objects import CheckpointId
from ...ops import Step
from .encode import PutEncoder
from .keys import _config, _key, _parse, _target
from .meta import from_log, to_log

RECENT = 16  # entries a put looks through for its parent before reading the whole log


class Steps:
    """The reads and writes of CasSaver, over ``self._core``."""

    _core: Core
    _encoder: PutEncoder
    conflicts: str

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
                "m": to_log(get_serializable_checkpoint_metadata(config, metadata))}
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
        state = self._encoder.state(thread_id, ns, checkpoint, new_versions, self._core.types)
        info = yield from self._core.save(name, state, metadata=meta, parents=parents,
                                          check=check)
        self._encoder.saved(thread_id, ns, state, info.id)
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
               writes: list[PendingWrite], known: set[Any]) -> CheckpointTuple:
        """LangGraph's tuple of a checkpoint; one whose parent is no longer among the
        namespace's checkpoints (``known``: prune, delete_for_runs) has no parent."""
        lg, parent = info.metadata["lg"], info.metadata.get("lgp")
        if parent not in known:
            parent = None
        meta = cast(CheckpointMetadata, from_log(info.metadata["m"]))
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
        self._encoder.loaded(thread_id, ns, info.id, loaded[info.id].state)
        return self._tuple(thread_id, ns, info, loaded[info.id].state, writes.get(lg, []),
                           {e.metadata.get("lg") for e in entries})

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
                meta = from_log(info.metadata.get("m") or {})
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
            known = {e.metadata.get("lg") for e in entries}
            out += [self._tuple(thread_id, ns, info, loaded[info.id].state,
                                writes.get(str(info.metadata["lg"]), []), known)
                    for info in chosen]
            if limit is not None and len(out) >= limit:
                break
        return out
