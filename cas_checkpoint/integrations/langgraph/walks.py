"""CasSaver's steps that walk or cut a thread's history: copy, delete, prune, the
delta-channel walk."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import DeltaChannelHistory, PendingWrite, get_checkpoint_id

from cas_checkpoint.engine.steps import Step
from cas_checkpoint.errors import InvalidArgumentError, NotFoundError
from cas_checkpoint.format.objects import CheckpointId, LogEntry
from cas_checkpoint.integrations.langgraph.keys import _key, _target
from cas_checkpoint.integrations.langgraph.meta import from_log
from cas_checkpoint.integrations.langgraph.steps import RECENT, Steps


class Walks(Steps):
    """Steps over a thread's whole history."""

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

    def _prune(self, thread_ids: Sequence[str], strategy: str, only_ns: str | None = None
               ) -> Step[None]:
        if strategy not in ("keep_latest", "delete"):
            raise InvalidArgumentError(f"unknown prune strategy {strategy!r}: use "
                                       "'keep_latest' or 'delete'")
        for thread_id in thread_ids:
            if strategy == "delete":
                yield from self._delete_thread(thread_id)
                continue
            for _name, _t, ns in (yield from self._names(str(thread_id))):
                if only_ns is not None and ns != only_ns:
                    continue
                keep = yield from self._needed(str(thread_id), ns)
                yield from self._retain(str(thread_id), ns, keep)

    def _needed(self, thread_id: str, ns: str) -> Step[set[str]]:
        """What ``keep_latest`` keeps of a namespace: its latest checkpoint (the one get_tuple
        loads) and, when the graph has DeltaChannels (the keys of the checkpoint's
        ``counters_since_delta_snapshot``), the ancestors down to the nearest one holding a
        value (a snapshot) of each, so the kept state rebuilds as it was."""
        name = _key(thread_id, ns)
        entries = yield from self._entries(name)
        by_lg = {str(e.metadata.get("lg")): e for e in entries}
        if not by_lg:
            return set()
        info = by_lg[max(by_lg)]
        keep = {str(info.metadata["lg"])}
        meta = from_log(info.metadata.get("m") or {})
        missing = set(meta.get("counters_since_delta_snapshot") or ())
        while missing:
            state = (yield from self._core.load(name, info.id)).state
            missing -= set(state.get("channel_values", {}))
            parent = info.metadata.get("lgp")
            if not missing or parent not in by_lg or parent in keep:
                break
            keep.add(parent)
            info = by_lg[parent]
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
        """The writes to these DeltaChannels since their nearest snapshot, walking up the
        parent chain of the checkpoint (the latest one) with one cursor over the log
        (``cursor.py``): it reads back as far as the snapshot, not the whole log, and loads
        the chain's states a batch at a time."""
        if not channels:
            return {}
        thread_id, ns = _target(config)
        name = _key(thread_id, ns)
        got = yield from self._cursor(name)
        cid = get_checkpoint_id(config)
        target = None if got is None else got[1].find(cid) if cid else got[1].latest()
        collected: dict[str, list[PendingWrite]] = {c: [] for c in channels}
        seeds: dict[str, Any] = {}
        remaining = set(channels)
        chain: list[LogEntry] = []
        parent = None if target is None else target.metadata.get("lgp")
        writes: dict[str, list[PendingWrite]] = {}
        states: dict[CheckpointId, Any] = {}
        n = 0
        while remaining and got is not None:
            head, cursor = got
            if n == len(chain):  # the next batch of ancestors, their writes and states
                while parent is not None and len(chain) < n + RECENT:
                    found = cursor.find(str(parent))
                    if found is None or any(e is found for e in chain):
                        break
                    chain.append(found)
                    parent = found.metadata.get("lgp")
                if n == len(chain):
                    break
                batch = chain[n:]
                cursor.reach(batch)
                lgs = {str(e.metadata["lg"]) for e in batch}
                writes.update((yield from self._writes(thread_id, ns, lgs,
                                                       cursor.writes(lgs), head)))
                states.update((yield from self._load(name, head, [e.id for e in batch])))
            entry = chain[n]
            n += 1
            for write in reversed(writes.get(str(entry.metadata["lg"]), [])):
                if write[1] in remaining:
                    collected[write[1]].append(write)
            values = states[entry.id]["channel_values"]
            for ch in list(remaining):
                if ch in values:
                    seeds[ch] = values[ch]
                    remaining.discard(ch)
        out: dict[str, DeltaChannelHistory] = {}
        for ch in channels:
            item: DeltaChannelHistory = {"writes": list(reversed(collected[ch]))}
            if ch in seeds:
                item["seed"] = seeds[ch]
            out[ch] = item
        return out
