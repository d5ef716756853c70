"""Per-thread figures for ``stats(by_thread=True)``: checkpoints, messages, logical and
physical bytes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cas_checkpoint.backends import ObjectInfo
from cas_checkpoint.engine.model import ThreadStats
from cas_checkpoint.engine.object_store import key_pack_id
from cas_checkpoint.engine.refs import Ref, thread_key
from cas_checkpoint.engine.steps import Step
from cas_checkpoint.format.heads import PackRef
from cas_checkpoint.format.objects import LogEntry


def message_count(state: Any) -> int | None:
    """``len(state["messages"])`` (or of a ``messages`` attribute) when that is a list or a
    tuple; None for a state without one."""
    messages = (state.get("messages") if isinstance(state, Mapping)
                else getattr(state, "messages", None))
    return len(messages) if isinstance(messages, list | tuple) else None


def by_thread(threads: list[tuple[str, Ref | None]], logs: Mapping[str, list[LogEntry]],
              packs: list[ObjectInfo], refs: list[ObjectInfo],
              head_state: Callable[[str, Ref], Step[Any]],
              named: Mapping[str, tuple[PackRef, ...]]) -> Step[dict[str, ThreadStats]]:
    """Each thread's figures. Physical bytes are its ref's plus those of the packs it names,
    ``named[thread]`` (its head's, and a long thread's archive pack and the packs that lists:
    engine/archive.py; a pack two threads share counts in both: the sum over threads can exceed
    the store's total). Messages come from its head state, loaded with
    ``head_state(thread, ref)``."""
    pack_sizes = {key_pack_id(i.key): i.size for i in packs}
    ref_sizes = {i.key: i.size for i in refs}
    out: dict[str, ThreadStats] = {}
    for thread, ref in threads:
        if ref is None:  # deleted since it was listed
            continue
        entries = logs.get(thread, [])
        logical = sum(e.size for e in entries)
        mine = named.get(thread, ref.head.packs)
        physical = ref_sizes.get(thread_key(thread), 0) + sum(
            pack_sizes.get(p.id, p.size) for p in mine)
        messages = None
        if ref.head.head is not None:
            messages = message_count((yield from head_state(thread, ref)))
        out[thread] = ThreadStats(len(entries), messages, logical, physical,
                                  logical / physical if physical else 0.0, len(mine))
    return out
