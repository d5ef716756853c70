"""Repack: rewrite a thread's packs without the objects none of its checkpoints reaches."""

from __future__ import annotations

from dataclasses import dataclass

from cas_checkpoint.engine import live
from cas_checkpoint.engine.object_store import View
from cas_checkpoint.engine.refs import Ref, RefStore, new_lineage
from cas_checkpoint.engine.staging import make_pack
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
    # the pack that replaces its packs (with dry_run: the one it would write), and those packs
    new_pack: PackRef | None = None
    old_packs: tuple[ObjectId, ...] = ()


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
        level = max(live.level(p) for p in head.packs)  # (one pack: history, not live)
        old = tuple(p.id for p in head.packs)
        if dry_run:  # the pack a run would write (its id and size), built and not written
            compressor = yield from refs.objects.would_settle()
            pack, _ = make_pack(kept, level, compressor)
            return ThreadRepack(thread_id, len(head.packs), before, after, False, pack, old)
        compressor = yield from refs.objects.settle()
        pack, data = make_pack(kept, level, compressor)
        yield from refs.objects.put_packs({pack.id: data})  # the pack, then the ref naming it

        def change(cur: Ref | None, ref: Ref = ref, pack: PackRef = pack
                   ) -> Step[tuple[Head | None, dict[ObjectId, bytes]]]:
            if cur is None or cur.version != ref.version:
                raise _Moved
            h = cur.head
            return Head(h.thread_id, h.head, h.head_step, h.peaks, h.tail, (pack,), h.inline,
                        new_lineage()), {}
            yield  # pragma: no cover - a step

        try:
            yield from refs.update(thread_id, change, current=ref, collect=False)  # (gc's)
        except _Moved:
            continue  # a save landed meanwhile: look again
        return ThreadRepack(thread_id, len(head.packs), before, after, True, pack, old)
    raise StorageError(f"thread {thread_id!r}: gave up repacking after {ATTEMPTS} attempts; it "
                       "is being written to constantly. Retry when it is quieter.")


class _Moved(Exception):
    pass
