"""Repack: rewrite a thread's packs without the objects none of its checkpoints reaches."""

from __future__ import annotations

from dataclasses import dataclass

from cas_checkpoint.engine import live
from cas_checkpoint.engine.object_store import View
from cas_checkpoint.engine.refs import Ref, RefStore, new_lineage
from cas_checkpoint.engine.staging import SPLIT_LEVEL, make_pack
from cas_checkpoint.engine.steps import Step
from cas_checkpoint.errors import InvalidArgumentError, StorageError
from cas_checkpoint.format.heads import Head, PackRef
from cas_checkpoint.format.objects import ObjectId, Record, Segment, decode_node
from cas_checkpoint.humanize import plural

ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class ThreadRepack:
    """What repack found (and did) in one thread."""

    thread_id: str
    packs_before: int
    bytes_before: int  # of the objects in its packs
    bytes_after: int  # of the objects its checkpoints reach
    repacked: bool
    # the pack that replaces its packs (with dry_run: the one it would write), and those packs;
    # the live pack written after it, if any (what the newest entries reach: live.py)
    new_pack: PackRef | None = None
    old_packs: tuple[ObjectId, ...] = ()
    more_packs: tuple[PackRef, ...] = ()

    @property
    def new_packs(self) -> tuple[PackRef, ...]:
        """Every pack that replaces its packs (none: not repacked)."""
        return () if self.new_pack is None else (self.new_pack, *self.more_packs)


@dataclass(frozen=True, slots=True)
class RepackReport:
    dry_run: bool
    threads: tuple[ThreadRepack, ...]

    @property
    def freed_bytes(self) -> int:
        """Bytes the repacked threads no longer name (gc deletes them after its grace; with
        dry_run, those a run would free)."""
        return sum(t.bytes_before - t.bytes_after for t in self.threads
                   if t.new_pack is not None)

    def to_text(self) -> str:
        verb = "would repack" if self.dry_run else "repacked"
        done = [t for t in self.threads if t.new_pack is not None]
        garbage = sum(t.bytes_before - t.bytes_after for t in self.threads)
        return (f"{verb} {len(done)} of {plural(len(self.threads), 'thread')}; their packs hold "
                f"{plural(garbage, 'byte')} no checkpoint reaches ({self.freed_bytes} "
                f"{'would be' if self.dry_run else 'now'} unnamed: "
                "gc deletes them once older than its grace)")


def check(min_garbage: object) -> None:
    if (not isinstance(min_garbage, (int, float)) or isinstance(min_garbage, bool)
            or not 0 <= min_garbage <= 1):
        raise InvalidArgumentError(f"min_garbage must be a fraction in [0, 1], not "
                                   f"{min_garbage!r}")


def repack(refs: RefStore, threads: list[str], *, min_garbage: float,
           dry_run: bool) -> Step[RepackReport]:
    check(min_garbage)
    out = []
    for thread in threads:
        got = yield from repack_thread(refs, thread, min_garbage=min_garbage, dry_run=dry_run)
        if got is not None:
            out.append(got)
    return RepackReport(dry_run, tuple(out))


def reachable(head: Head, view: View) -> set[str]:
    """Ids of every object the thread's log reaches: segments, records, state nodes."""
    seen: set[str] = set()
    todo: list[str] = []
    entries = list(head.tail)
    segs = [p.id for p in head.peaks]
    while segs:
        oid = segs.pop()
        if oid in seen:
            continue
        seen.add(oid)
        seg = Segment.decode(view.get(oid))
        segs.extend(seg.children)
        entries.extend(seg.entries)
    for entry in entries:
        if entry.id not in seen:
            seen.add(entry.id)
            todo.extend(Record.decode(view.get(entry.id)).children())
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(decode_node(view.get(node))[0])
    return seen


def repack_thread(refs: RefStore, thread_id: str, *, min_garbage: float,
                  dry_run: bool) -> Step[ThreadRepack | None]:
    """Repack one thread when at least ``min_garbage`` of its pack bytes are unreachable."""
    for _ in range(ATTEMPTS):
        ref = yield from refs.read(thread_id)
        if ref is None or ref.head.head is None:
            return None
        head = ref.head
        view: View = (yield from refs.objects.view(head)).whole()
        keep = reachable(head, view)
        packed = {oid: obj for pack in view.packs for oid, obj in pack.objects.items()}
        before = sum(len(v) for v in packed.values())
        kept = {ObjectId(k): view.get(k) for k in sorted(keep) if k in packed}
        after = sum(len(v) for v in kept.values())
        report = ThreadRepack(thread_id, len(head.packs), before, after, False)
        if not head.packs or before == 0 or (before - after) / before < min_garbage:
            return report
        level = max(live.level(p) for p in head.packs)  # (history, not live: its own level)
        old = tuple(p.id for p in head.packs)
        parts = split(head, kept, level)
        if dry_run:  # the packs a run would write (their ids and sizes), built and not written
            compressor = yield from refs.objects.would_settle()
            made = tuple(make_pack(objects, at, compressor)[0] for objects, at in parts)
            return ThreadRepack(thread_id, len(head.packs), before, after, False, made[0], old,
                                made[1:])
        compressor = yield from refs.objects.settle()
        built = [make_pack(objects, at, compressor) for objects, at in parts]
        made = tuple(pack for pack, _ in built)
        yield from refs.objects.put_packs({p.id: data for p, data in built})  # then the ref

        def change(cur: Ref | None, ref: Ref = ref, made: tuple[PackRef, ...] = made
                   ) -> Step[tuple[Head | None, dict[ObjectId, bytes]]]:
            if cur is None or cur.version != ref.version:
                raise _Moved
            h = cur.head
            return Head(h.thread_id, h.head, h.head_step, h.peaks, h.tail, made, h.inline,
                        new_lineage()), {}
            yield  # pragma: no cover - a step

        try:
            yield from refs.update(thread_id, change, current=ref, collect=False)  # (gc's)
        except _Moved:
            continue  # a save landed meanwhile: look again
        return ThreadRepack(thread_id, len(head.packs), before, after, True, made[0], old,
                            made[1:])
    raise StorageError(f"thread {thread_id!r}: gave up repacking after {ATTEMPTS} attempts; it "
                       "is being written to constantly. Retry when it is quieter.")


def split(head: Head, kept: dict[ObjectId, bytes], level: int
          ) -> list[tuple[dict[ObjectId, bytes], int]]:
    """The packs a repack writes, as a merge of ``level`` would (``staging.stage``): what the
    head's newest entries reach in a live pack after the history pack, so that a cold read of
    the newest state right after a repack decompresses that, not the whole thread; one pack
    when the thread is small (below ``SPLIT_LEVEL``) or all of it is live."""
    if level < SPLIT_LEVEL:
        return [(kept, level)]
    hot = live.reached(head, kept.get) & kept.keys()
    if not hot or len(hot) == len(kept):
        return [(kept, level)]
    return [({k: v for k, v in kept.items() if k not in hot}, level),
            ({k: v for k, v in kept.items() if k in hot}, live.LIVE + level)]


class _Moved(Exception):
    pass
