"""Taking a thread into a store: the receiving end of ``import_bundle`` and ``copy_threads``.
Rule: a thread's ref is written last, after every object it reaches."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from cas_checkpoint.backends import ObjectInfo
from cas_checkpoint.engine import live
from cas_checkpoint.engine.core import Core
from cas_checkpoint.engine.object_store import pack_key
from cas_checkpoint.engine.refs import Ref, build, new_lineage, thread_key
from cas_checkpoint.engine.staging import INLINE_MAX, MERGE_FACTOR, make_pack
from cas_checkpoint.engine.steps import List, ReadRefs, Step
from cas_checkpoint.errors import (
    CasError,
    ConflictError,
    FormatError,
    IntegrityError,
    NotFoundError,
)
from cas_checkpoint.format.heads import Head, PackRef
from cas_checkpoint.format.objects import (
    NODE,
    CheckpointId,
    LogEntry,
    ObjectId,
    Record,
    decode_node,
    object_id,
    object_kind,
)

log = logging.getLogger("cas_checkpoint")

PACK_BYTES = 8 << 20  # new objects are written in packs of about this many bytes
READ_BATCH_BYTES = 256 << 20  # packs of sharing threads read per round, about

Progress = Callable[[int, int | None], None]
"""``progress(done, total)``: objects handled so far, and how many there are (None: unknown)."""


@dataclass(slots=True)
class BundleReport:
    """What an export, an import or the copy of one thread did.

    export: ``objects`` (= ``objects_written``) objects went into a bundle of ``bytes`` bytes.
    import/copy: the bundle (``bytes`` of it) held ``objects`` objects, of which the store did
    not have ``objects_written`` and wrote them (in ``bytes_written`` bytes of packs; log
    segments rebuilt for the new head are not counted as objects). ``status``: ``exported``,
    ``created``, ``fast-forward`` or ``unchanged``."""

    thread_id: str
    checkpoints: int
    objects: int
    objects_written: int
    bytes: int
    bytes_written: int = 0
    status: str = ""
    head: CheckpointId | None = None


@dataclass(frozen=True, slots=True)
class Header:
    thread_id: str
    head: CheckpointId
    head_step: int
    entries: int
    objects: int | None  # None: not known before the objects are walked
    bytes: int | None


class Source(Protocol):
    """One thread on its way in (see the module docstring)."""

    def header(self) -> Step[Header]: ...
    def entries(self) -> Step[list[LogEntry]]: ...
    def record_threads(self) -> Step[set[str]]: ...
    def next_object(self) -> Step[tuple[ObjectId, bytes] | None]: ...
    def finish(self, checker: Checker) -> Step[None]: ...
    @property
    def total(self) -> int | None: ...
    @property
    def size(self) -> int: ...
    @property
    def trusted(self) -> bool: ...


# --- checks of what comes in ------------------------------------------------------------------


def check_log(header: Header, entries: list[LogEntry]) -> dict[str, LogEntry]:
    """The entries by id, after checking that they make a log the header describes."""
    if len(entries) != header.entries:
        raise FormatError(f"the bundle says it holds {header.entries} checkpoints but lists "
                          f"{len(entries)}; it is damaged")
    by_id: dict[str, LogEntry] = {}
    for entry in entries:
        if entry.id in by_id:
            raise FormatError(f"checkpoint {entry.id} is listed twice in the bundle's log; the "
                              "bundle is damaged")
        by_id[entry.id] = entry
    top = by_id.get(header.head)
    if top is None:
        raise FormatError(f"the bundle's head {header.head} is not one of its checkpoints; the "
                          "bundle is damaged")
    if top.step != header.head_step:
        raise FormatError(f"the bundle's head is at step {top.step}, not {header.head_step} as "
                          "its header says; the bundle is damaged")
    return by_id


class Checker:
    """Takes objects one by one: each must hash to its id, be named by a log entry or by an
    object taken before it, and (a record) say what its log entry says."""

    def __init__(self, by_id: dict[str, LogEntry]) -> None:
        self.by_id = by_id
        self.wanted: set[str] = set(by_id)
        self.seen: set[str] = set()
        self.threads: set[str] = set()
        self.bytes = 0

    def take(self, oid: str, data: bytes) -> None:
        actual = object_id(data)
        if actual != oid:
            raise IntegrityError(oid, actual, f"bundle object {oid}")
        if oid not in self.wanted:
            why = "comes twice" if oid in self.seen else "is named by no checkpoint before it"
            raise FormatError(f"object {oid} of the bundle {why}; the bundle is damaged or was "
                              "not written by cas_checkpoint")
        self.wanted.discard(oid)
        self.seen.add(oid)
        self.bytes += len(data)
        try:
            entry = self.by_id.get(oid)
            if entry is not None:
                record = Record.decode(data)
                if record.entry(CheckpointId(oid)) != entry:
                    raise FormatError(f"the log entry of checkpoint {oid} does not say what its "
                                      "record says; the bundle's history is damaged")
                self.threads.add(record.thread_id)
                children = record.children()
            elif object_kind(data) == NODE:
                children = decode_node(data)[0]
            else:
                raise FormatError(f"object {oid} of the bundle is neither a checkpoint of its "
                                  "log nor a state node")
        except CasError:
            raise
        except Exception as exc:  # hostile bytes: never anything but a FormatError
            raise FormatError(f"object {oid} of the bundle does not decode: {exc}") from None
        for child in children:
            if child not in self.seen:
                self.wanted.add(child)

    def done(self) -> None:
        if self.wanted:
            some = ", ".join(sorted(self.wanted)[:3])
            raise FormatError(f"the bundle lacks {len(self.wanted)} objects its checkpoints "
                              f"need (for instance {some}); it is truncated or damaged")


# --- what the receiving store holds -----------------------------------------------------------


class Refs:
    """Every ref of a store, read once (``copy_threads`` keeps it up to date as it writes)."""

    def __init__(self, refs: dict[str, Ref]) -> None:
        self.refs = refs

    @staticmethod
    def read(core: Core) -> Step[Refs]:
        threads = yield from core.refs.threads()
        keys = [thread_key(t) for t in threads]
        got = (yield ReadRefs(keys)) if keys else []
        out: dict[str, Ref] = {}
        for thread, key, one in zip(threads, keys, got, strict=True):
            try:
                ref = core.refs.decode(thread, key, one)
            except CasError as exc:
                log.warning("%s: not looking for shared objects in thread %r: %s", core.url,
                            thread, exc)
                continue
            if ref is not None and ref.head.head is not None:
                out[thread] = ref
        return Refs(out)


@dataclass(slots=True)
class Held:
    """Objects the receiving store holds: by id, the pack named by a ref that holds it, and the
    objects refs hold inline (ids only: their bytes come in again)."""

    packs: dict[str, PackRef] = field(default_factory=dict)
    inline: set[str] = field(default_factory=set)

    @staticmethod
    def read(core: Core, heads: list[Head]) -> Step[Held]:
        held = Held()
        wanted: dict[str, PackRef] = {}
        for head in heads:
            held.inline.update(object_id(d) for d in head.inline)
            for p in head.packs:
                wanted.setdefault(p.id, p)
        batch: list[PackRef] = []
        size = 0
        for one in [*wanted.values(), None]:
            if one is not None:
                batch.append(one)
                size += one.size
            if batch and (one is None or size >= READ_BATCH_BYTES):
                yield from held._add(core, batch)
                batch, size = [], 0
        return held

    def _add(self, core: Core, batch: list[PackRef]) -> Step[None]:
        try:
            got = yield from core.objects.packs([p.id for p in batch])
        except (NotFoundError, IntegrityError, FormatError):
            got = {}  # one of them is bad: take the others one by one
            for p in batch:
                try:
                    got.update((yield from core.objects.packs([p.id])))
                except (NotFoundError, IntegrityError, FormatError) as exc:
                    log.warning("%s: pack %s not reused: %s", core.url, p.id, exc)
        for p in batch:
            pack = got.get(p.id)
            if pack is not None:
                for oid in pack.objects:
                    self.packs.setdefault(oid, p)


def _sharing(refs: Refs, target: str, by_id: dict[str, LogEntry], segments: set[str],
             threads: set[str]) -> list[Head]:
    """Heads of the threads that share history with the incoming log (the target first)."""
    out = []
    for thread, ref in refs.refs.items():
        head = ref.head
        if (thread == target or thread in threads or head.head in by_id
                or any(p.id in segments for p in head.peaks)
                or any(e.id in by_id or any(q in by_id for q in e.parents) for e in head.tail)):
            out.append(head)
    out.sort(key=lambda h: h.thread_id != target)
    return out


def _hold(core: Core, heads: list[Head], target: str) -> Step[list[Head]]:
    """``heads``, those of other threads than ``target`` read anew with their packs marked
    held (the import may name them: their writers must not delete them; collect.py)."""
    out = []
    for head in heads:
        if head.thread_id != target:
            try:
                head = (yield from core.refs.hold(head.thread_id)).head
            except NotFoundError:  # deleted meanwhile: nothing of it is reused
                continue
        out.append(head)
    return out


def _relation(current: list[LogEntry], current_head: CheckpointId | None,
              entries: list[LogEntry], head: CheckpointId) -> str:
    if current == entries and current_head == head:
        return "unchanged"
    if len(current) <= len(entries) and entries[:len(current)] == current:
        return "fast-forward"
    return "conflict"


class HistoryConflict(ConflictError):
    """The target thread exists with a history the incoming one does not continue."""

    def __init__(self, thread_id: str, url: str, actual: str | None, head: str,
                 count: int) -> None:
        CasError.__init__(
            self,
            f"thread {thread_id!r} already exists in {url} with another history ({count} "
            f"checkpoints, head {actual}) that the incoming one (head {head}) does not "
            "continue; nothing was changed. Import it under another name: as_thread='...' "
            "(cas-checkpoint import --as NEW_THREAD), or delete the thread first.")
        self.thread_id, self.expected, self.actual = thread_id, head, actual


class _Unchanged(Exception):
    """Internal: the target thread has this history already (another import landed first)."""


def level_for(size: int) -> int:
    """The merge level of a pack of ``size`` bytes (what geometric merging would give it)."""
    return min(63, max(0, int(math.log(max(size, 1) / INLINE_MAX, MERGE_FACTOR))))


# --- the receiving end ------------------------------------------------------------------------


def receive(core: Core, source: Source, as_thread: str | None = None,
            progress: Progress | None = None, refs: Refs | None = None) -> Step[BundleReport]:
    """Take the thread ``source`` hands over into the store of ``core`` (module docstring)."""
    header = yield from source.header()
    target = header.thread_id if as_thread is None else as_thread
    thread_key(target)
    entries = yield from source.entries()
    by_id = check_log(header, entries)
    report = BundleReport(target, len(entries), 0, 0, 0, head=header.head)

    current = yield from core.refs.read(target)
    if current is not None and current.head.head is None:
        current = None
    relation = "created"
    if current is not None:
        mine = yield from core.refs.entries(current.head)
        relation = _relation(mine, current.head.head, entries, header.head)
        if relation == "conflict":
            raise HistoryConflict(target, core.url, current.head.head, header.head, len(mine))
    writing = relation != "unchanged"
    if not writing and source.trusted:
        report.status = "unchanged"
        return report

    held = Held()
    used: dict[str, PackRef] = {}  # packs named by refs that hold what is needed
    if writing:
        segments: dict[ObjectId, bytes] = {}
        build(Head(target, None), entries, header.head, segments)
        threads = yield from source.record_threads()
        if refs is None:
            refs = yield from Refs.read(core)
        if current is not None:
            refs.refs[target] = current
        heads = _sharing(refs, target, by_id, set(segments), threads)
        heads = yield from _hold(core, heads, target)
        held = yield from Held.read(core, heads)
        for sid in segments:  # the log segments the new head will have, where held
            holder = held.packs.get(sid)
            if holder is not None:
                used[holder.id] = holder

    checker = Checker(by_id)
    pending: dict[ObjectId, bytes] = {}
    pending_bytes = 0
    carried: dict[ObjectId, bytes] = {}  # held inline by some ref: they go into the new head
    new_packs: list[PackRef] = []

    def flush() -> Step[None]:
        nonlocal pending_bytes
        compressor = yield from core.objects.settle()
        ref, data = make_pack(pending, level_for(pending_bytes), compressor)
        listed: list[ObjectInfo] = yield List(f"{pack_key(ref.id).rsplit('/', 1)[0]}")
        there = any(i.key == pack_key(ref.id) and i.size == len(data) for i in listed)
        yield from core.objects.put_packs({ref.id: data})  # written, or refreshed for gc
        if not there:
            report.objects_written += len(pending)
            report.bytes_written += len(data)
        new_packs.append(ref)
        pending.clear()
        pending_bytes = 0

    while (item := (yield from source.next_object())) is not None:
        oid, data = item
        checker.take(oid, data)
        report.objects += 1
        if progress is not None:
            progress(report.objects, source.total)
        if not writing:
            continue
        holder = held.packs.get(oid)
        if holder is not None:
            used[holder.id] = holder
        elif oid in held.inline:
            carried[oid] = data
        else:
            pending[oid] = data
            pending_bytes += len(data)
            if pending_bytes >= PACK_BYTES:
                yield from flush()
    checker.done()
    yield from source.finish(checker)
    report.bytes = source.size
    if header.objects is not None and header.objects != report.objects:
        raise FormatError(f"the bundle says it holds {header.objects} objects but holds "
                          f"{report.objects}; it is damaged")
    if not writing:
        report.status = "unchanged"
        return report
    if pending_bytes > INLINE_MAX:
        yield from flush()
    small = len(pending)
    carried.update(pending)
    base_packs: set[str] = set()

    def change(ref: Ref | None) -> Step[tuple[Head | None, dict[ObjectId, bytes]]]:
        if ref is None or ref.head.head is None:
            base = Head(target, None, lineage=new_lineage())
            status = "created"
        else:
            mine = yield from core.refs.entries(ref.head)
            status = _relation(mine, ref.head.head, entries, header.head)
            if status == "unchanged":
                raise _Unchanged
            if status == "conflict":
                raise HistoryConflict(target, core.url, ref.head.head, header.head, len(mine))
            base = ref.head
        names = {p.id for p in base.packs}
        base_packs.clear()
        base_packs.update(names)
        added = [p for p in [*used.values(), *new_packs] if p.id not in names]
        added.sort(key=lambda p: -live.level(p))  # (stable) levels never increase along the
        # list; a live pack stays after its history pack (live.py)
        packs = (*base.packs, *added)
        segs: dict[ObjectId, bytes] = {}
        head = build(Head(target, None, packs=packs, inline=base.inline,
                          lineage=base.lineage, archive=base.archive,
                          held=base.held | {p.id for p in used.values()}),
                     entries, header.head, segs)
        names.update(p.id for p in added)
        new = dict(carried)
        for sid, data in segs.items():
            holder = held.packs.get(sid)
            if holder is None or holder.id not in names:
                new[sid] = data
        report.status = status
        return head, new

    core.forget(target)
    try:
        ref = yield from core.refs.update(target, change, current=current)
    except _Unchanged:
        report.status = "unchanged"
        return report
    assert ref is not None
    report.objects_written += small
    before = base_packs | set(used) | {p.id for p in new_packs}
    report.bytes_written += sum(p.size for p in ref.head.packs if p.id not in before)
    if refs is not None:
        refs.refs[target] = ref
    log.info("%s thread %r into %s: %d checkpoints, %d of %d objects written (%s)",
             "import" if as_thread is None else "import as", target, core.url,
             report.checkpoints, report.objects_written, report.objects, report.status)
    return report


