"""A save's commit: one compare-and-swap of a thread's ref that appends one prepared save, or
several (a group commit).

A save is prepared first (``prepare``: its arguments checked, its state split and hashed, pure
code, nothing written), then committed (``commit``): inside one compare-and-swap each part, in
order, runs its ``check`` on the head as the parts before it left it, gets its record and log
entry, and is appended; the new objects of every part are staged into the head or into one new
pack, written, and then the ref is swapped once. So N saves of one thread that are ready at
once cost what one save costs in storage requests and flushes (one pack at most, one ref
write), and each lands exactly as it would have alone, after the ones before it.

A part whose own check or metadata is refused (a ``ConflictError`` of a check, metadata a
reader would refuse) gets its error and is left out; the others go on, each seeing only the
parts that were appended. What concerns the thread as a whole fails every part: storage errors
(``StorageError``), a pack the head names that is gone (``NotFoundError``, which the
compare-and-swap loop retries on a moved ref), ``expected_head``, and a head too big to write
(``refs.check_size``: the head of the group, whose parts are not told apart there).

Pure steps (``ops.py``), like the rest of the engine."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cas_checkpoint.engine import model, retention
from cas_checkpoint.engine.caches import STATE_CACHE_BYTES, Known
from cas_checkpoint.engine.model import (
    UNSET,
    CheckpointInfo,
    Unset,
    add_meta,
    check_id,
    check_meta,
    info_of,
)
from cas_checkpoint.engine.refs import Ref, new_lineage, thread_key
from cas_checkpoint.engine.refs import append as log_append
from cas_checkpoint.engine.steps import Step
from cas_checkpoint.errors import InvalidArgumentError, NotFoundError, StorageError
from cas_checkpoint.format.heads import Head
from cas_checkpoint.format.objects import (
    MAX_PARENTS,
    CheckpointId,
    LogEntry,
    ObjectId,
    Record,
    hashed,
    inlinable,
    object_id,
)
from cas_checkpoint.tree import build as tree

if TYPE_CHECKING:
    from cas_checkpoint.engine.core import Core


Check = Callable[[Head], Step[dict[str, Any] | None]]
"""Runs inside the compare-and-swap on the head a part extends; may raise to refuse the part;
what it returns is added to the part's metadata."""


@dataclass(slots=True)
class Part:
    """One save, prepared: its checked arguments and its state's nodes (nothing written)."""

    root: ObjectId
    size: int
    nodes: dict[ObjectId, bytes]
    encoded: bytes | None  # the state's encoding, kept for warm loads when small
    inline: bytes | None  # the root node, when small enough to go inside the record
    label: str | None
    tags: tuple[str, ...]
    meta: dict[str, Any]
    status: str | None
    kind: str | None
    reason: str | None
    parents: tuple[CheckpointId, ...] | None  # None: the head it is appended to
    check: Check | None = None
    keep: tuple[int | None, bool] = (None, False)  # keep_last and exact: this save's policy
    retain: retention.Retain | None = None  # entries -> the entries to keep (integrations)
    # set by each attempt of ``commit``:
    record: Record | None = field(default=None, repr=False)
    entry: LogEntry | None = field(default=None, repr=False)
    error: Exception | None = field(default=None, repr=False)


def prepare(core: Core, state: Any, *, label: str | None = None, tags: Iterable[str] = (),
            metadata: dict[str, Any] | None = None,
            parents: Iterable[CheckpointId] | None = None, check: Check | None = None,
            status: str | None = None, kind: str | None = None,
            reason: str | None = None, keep_last: int | None | Unset = UNSET,
            retain: retention.Retain | None = None) -> Part:
    """Check a save's arguments and split its state into nodes (raises before anything is
    written). ``keep_last`` (this save only: exact) or the store's ``keep_last`` (exact or in
    batches, by ``keep_mode``) and ``retain`` drop checkpoints from the log in the commit."""
    if keep_last is not UNSET and keep_last is not None:
        retention.check_policy(keep_last, None)
    keep = ((core.keep_last, core.keep_mode == "exact") if keep_last is UNSET
            else (keep_last, True))
    label, tags_t, meta = check_meta(label, tags, metadata)
    status, kind, reason = model.check_annotations(status, kind, reason)
    given = None if parents is None else tuple(check_id(p, "parent") for p in parents)
    if given is not None and len(given) > MAX_PARENTS:
        raise InvalidArgumentError(f"parents names {len(given)} checkpoints, more than "
                                   f"{MAX_PARENTS}; a checkpoint merges a few parents")
    with core._memo_lock:
        built = tree.build(state, core.types, core._memo)  # raises before writing anything
    root, size, nodes = built.root, built.size, built.objects
    encoded = bytes(built.data) if size <= STATE_CACHE_BYTES // 4 else None
    del built  # a big state's encoding is not kept while its packs are written
    # A small root node goes inside the record instead of into an object of its own.
    root_node = nodes[root]
    inline = root_node if inlinable(root_node) else None
    if inline is not None:
        del nodes[root]  # (the build's own dict: nothing else holds it)
        hashed(inline, root)  # (the build hashed it: its record need not again)
    return Part(root, size, nodes, encoded, inline, label, tags_t, meta, status, kind, reason,
                given, check, keep, retain)


class _NoneLeft(Exception):
    """Every part of a group was refused: there is nothing to write."""


def commit(core: Core, thread_id: str, parts: list[Part],
           expected_head: CheckpointId | None | Unset = UNSET) -> Step[list[Part]]:
    """Append ``parts`` to the thread in one compare-and-swap (see the module docs). Returns
    the parts: each has its ``entry`` (landed) or its ``error`` (refused, not written)."""
    thread_key(thread_id)
    if expected_head is not UNSET and expected_head is not None:
        expected_head = check_id(expected_head, "expected_head")
    current = core._known.get(thread_id, UNSET)
    known = core._have.get(thread_id)
    done: dict[str, Any] = {}

    def change(ref: Ref | None) -> Step[tuple[Head | None, dict[ObjectId, bytes]]]:
        base = Head(thread_id, None, lineage=new_lineage()) if ref is None else ref.head
        # Objects a head of this lineage held are held by every later head of it: skip
        # writing the nodes this process saw there. Otherwise write them all.
        skip = known if known is not None and known.lineage == base.lineage else None
        new: dict[ObjectId, bytes] = {}
        head = base
        for part in parts:
            part.record = part.entry = part.error = None
            segments: dict[ObjectId, bytes] = {}
            try:
                record, data, entry, after = yield from _append(core, head, part, segments)
            except (NotFoundError, StorageError):
                raise  # (the thread's, not this part's: see the module docs)
            except Exception as exc:  # this part is refused; the others go on
                part.error = exc
                continue
            part.record, part.entry = record, entry
            if part.nodes:  # (none: a small state's root rides in its record)
                new.update(part.nodes if skip is None else skip.missing(part.nodes))
            new[ObjectId(entry.id)] = data
            new.update(segments)
            # The next part's check reads this head: its new log segments ride in it
            # (inline) until the group's objects are staged below.
            head = after if not segments else Head(
                after.thread_id, after.head, after.head_step, after.peaks, after.tail,
                after.packs, after.inline + tuple(segments.values()), after.lineage,
                after.archive, after.held)
        if all(p.entry is None for p in parts):
            raise _NoneLeft
        done["base"], done["lineage"], done["skip"], done["new"] = (
            base.head, base.lineage, skip, new)
        return head.storage(base), new

    def holds(ref: Ref) -> Step[bool]:
        last = next((p.entry for p in reversed(parts) if p.entry is not None), None)
        return ((yield from core.refs.holds(ref.head, last, done["base"]))
                if last is not None and done else False)

    # (What this store object knows of the thread stays in place while this commit runs: the
    # ref it last saw (a guess here, and a log only grows at its end: a reader that finds a
    # checkpoint in it needs no read, as the LangGraph saver's parent lookup of the next put
    # while pending writes commit), and the objects the lineage holds (concurrent saves on one
    # thread, from tasks or threads, each skip them). A commit that fails forgets the ref.)
    try:
        ref = yield from core.refs.update(thread_id, change, expected_head=expected_head,
                                          current=current, done=holds)
    except _NoneLeft:
        return parts
    except BaseException:
        core._threads.forget(thread_id, ref_only=True)
        raise
    landed = [p for p in parts if p.entry is not None]
    for part in landed:
        if part.encoded is not None:
            core._warm.state(thread_id, part.root, part.encoded, part.nodes)
    last = landed[-1]
    assert last.entry is not None and last.record is not None
    if ref is not None and ref.head.head == last.entry.id:  # (not one that held it already)
        core._warm.newest(thread_id, ref.head, last.record)
    if ref is not None and ref.head.lineage == done["lineage"]:
        have = done["skip"] or Known(done["lineage"])
        for part in landed:
            have.add(part.nodes)  # the states' nodes, and all the commit wrote
        have.add(done["new"])
        core._threads.remember(thread_id, ref, have)
    return parts


def _append(core: Core, head: Head, part: Part, segments: dict[ObjectId, bytes]
            ) -> Step[tuple[Record, bytes, LogEntry, Head]]:
    """``part`` appended to ``head``: its record and the record's bytes, its log entry and the
    new head (its new log segments go into ``segments``)."""
    extra = (yield from part.check(head)) if part.check is not None else None
    entry_meta = add_meta(part.meta, extra) if extra else part.meta
    parents = part.parents if part.parents is not None else (head.head,) if head.head else ()
    record = Record(head.thread_id, parents, part.root, head.head_step + 1, time.time(),
                    part.size, part.label, part.tags, entry_meta, part.inline, part.status,
                    part.kind, part.reason)
    data = record.encode()
    cid = CheckpointId(object_id(data))
    entry = record.entry(cid)
    after = log_append(head, entry, segments)
    # Retention on save (open(keep_last=N), save(keep_last=N), an integration's retain): drop
    # the oldest unlabelled checkpoints in this same compare-and-swap, past N exactly or every
    # few saves past N (retention.prune_due: amortised).
    keep_n, exact = part.keep
    if part.retain is not None or retention.prune_due(after.count, keep_n, exact):
        segments.clear()
        after = yield from retention.pruned_head(core.refs, head, entry, keep_n, segments,
                                                 part.retain)
        got = yield from core.refs.missing(head, segments)
        segments.clear()
        segments.update(got)
    return record, data, entry, after


def infos(thread_id: str, parts: list[Part]) -> list[CheckpointInfo | Exception]:
    """Each part's result: its ``CheckpointInfo``, or the error that refused it."""
    out: list[CheckpointInfo | Exception] = []
    for part in parts:
        if part.entry is not None:
            out.append(info_of(part.entry, thread_id))
        else:
            assert part.error is not None
            out.append(part.error)
    return out
