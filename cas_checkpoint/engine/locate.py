"""Reads across threads: finding a checkpoint whatever its thread (``get``, ``diff``), and
running a read over every thread's ref again when a writer moved one of them meanwhile.

A writer deletes the packs its merges replaced a few commits later (``collect.py``). A read of
one thread retries through ``Core.at_ref``; a read over every thread (``get`` by id, ``diff``,
``search`` of the whole store) retries here, the same way: when something it fetched is gone,
the refs it read are read again, and if one of them moved, the whole read runs again on the
new refs (up to ``LOAD_RETRIES`` times). If none moved, what is gone is damage, and the error
stands."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from cas_checkpoint.engine import seek
from cas_checkpoint.engine.archive import InArchive
from cas_checkpoint.engine.object_store import View
from cas_checkpoint.engine.refs import Ref, thread_key
from cas_checkpoint.engine.steps import ReadRefs, Step
from cas_checkpoint.errors import FormatError, IntegrityError, NotFoundError, StorageError
from cas_checkpoint.format.heads import Head
from cas_checkpoint.format.objects import CheckpointId

if TYPE_CHECKING:
    from cas_checkpoint.engine.core import Core

log = logging.getLogger("cas_checkpoint")
_T = TypeVar("_T")
Refs = list[tuple[str, "Ref | None"]]
LOAD_RETRIES = 8  # a read whose packs a merge replaced and a writer deleted meanwhile
# re-reads the ref (``Core.at_ref``; across threads: ``across_refs``): a newer state each time


def across_refs(core: Core, read: Callable[[Refs], Step[_T]]) -> Step[_T]:
    """``read(refs)`` of every thread's ref, run again on newly read refs when it meets
    something gone (NotFoundError) and one of the refs it was given moved or went meanwhile."""
    for attempt in range(LOAD_RETRIES):
        refs = yield from core.all_refs()
        try:
            return (yield from read(refs))
        except InArchive:  # (not gone: the caller reads the head's archive next)
            raise
        except NotFoundError:
            had = [(t, r) for t, r in refs if r is not None]
            now = yield ReadRefs([thread_key(t) for t, _ in had])
            if all(g is not None and g[1] == r.version for (_, r), g in zip(had, now,
                                                                              strict=True)):
                raise  # nothing it read moved: what is missing is missing
            log.debug("a thread moved while a read across threads fetched what its ref named "
                      "(attempt %d); reading the refs again", attempt + 1)
            if attempt + 1 == LOAD_RETRIES:
                raise StorageError(
                    f"threads moved {LOAD_RETRIES} times while a read across the store's "
                    "threads fetched what their refs named (their writers' merges, or a repack "
                    "and a gc, replaced it; nothing is damaged); read it again") from None
    raise AssertionError("unreachable")  # pragma: no cover


def locate(core: Core, checkpoint_ids: list[CheckpointId], refs: Refs
           ) -> Step[dict[CheckpointId, View]]:
    """A view holding each checkpoint, whatever its thread (a thread whose log names it, else
    one that still holds its objects); NotFoundError if none does. (``get``, and ``diff.py``,
    which reads the nodes of two checkpoints through these views; run in ``across_refs``.)"""
    wanted = set(checkpoint_ids)
    out: dict[CheckpointId, View] = {}
    heads = [r.head for _, r in refs if r is not None]
    views: list[View] = []
    damage: IntegrityError | FormatError | NotFoundError | None = None  # (another thread's
    # damaged log does not hide the others)
    read: list[tuple[Head, View]] = []
    for head in heads:  # first by each record's step (seek.py: O(log n) a log)
        if head.head is None:
            continue
        view = yield from core.objects.view(head)
        views.append(view)
        read.append((head, view))
        for cid in wanted - out.keys():
            step = seek.step_of(view, cid)
            if step is not None and seek.find(head, view, cid, step) is not None:
                out[cid] = view
        if len(out) == len(wanted):
            return out
    for head, view in read:  # then the logs, newest entry first
        try:
            for e in core.refs.iter_newest_first(head, view):
                if e.id in wanted and e.id not in out:
                    out[e.id] = view
                    if len(out) == len(wanted):
                        return out
        except (IntegrityError, FormatError, NotFoundError) as exc:
            damage = damage or exc
    for view in views:  # rewound or pruned out of every log: its objects stay until repacked
        for cid in wanted - out.keys():
            if cid in view.frozen_ids():
                out[cid] = view
    for cid in checkpoint_ids:
        if cid not in out:
            if damage is not None:  # it may be in a log that could not be read
                raise damage
            raise NotFoundError(f"checkpoint {cid} does not exist in {core.url}")
    return out
