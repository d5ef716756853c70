"""Per-thread refs: the head of each thread and the log of its checkpoints (the parent DAG).

A thread's ref is one small mutable file, ``refs/heads/<thread key>``, changed only by
compare-and-swap. It holds the head checkpoint id, up to ``LEAF`` recent log entries (the tail),
and the roots ("peaks") of complete, immutable log segment trees stored as objects:

* when the tail reaches ``LEAF`` entries it becomes a level-0 segment;
* when ``FANOUT`` peaks of one level stand side by side they become one segment a level up.

So a save writes the head file (a few KB at most) and now and then one segment; the head holds at
most ``FANOUT - 1`` peaks per level, and reading the whole log takes one round of parallel reads
per level. Rewind, delete and fork rebuild the log from its entries; unchanged leading segments
come out byte-identical, so they are shared, not written again.
"""

from __future__ import annotations

import base64
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .backend import Backend, RefMismatch
from .errors import ConflictError, FormatError, InvalidArgumentError, StorageError
from .objects import CheckpointId, Head, LogEntry, ObjectId, Peak, Segment, object_id
from .objstore import ObjectStore

log = logging.getLogger("cas_checkpoint")

LEAF = 16
FANOUT = 16
MAX_THREAD_ID_BYTES = 128
HEADS = "refs/heads"
RETRIES = 64  # lost races in a row before giving up: 8 busy writers lose ~3 in 4
RACE_WAIT = 0.25  # cap of the random wait after a lost race, in seconds


def thread_key(thread_id: str) -> str:
    """The ref key of a thread: base32 of its UTF-8 bytes, so no id can leave ``refs/heads``
    (``/``, ``..``, unicode are just bytes here) and case-insensitive disks cannot mix ids up."""
    if not isinstance(thread_id, str):
        raise InvalidArgumentError(f"thread id must be a str, not {type(thread_id).__name__}")
    raw = thread_id.encode("utf-8", "surrogatepass")
    if not raw:
        raise InvalidArgumentError("thread id is empty; pass a non-empty string")
    if len(raw) > MAX_THREAD_ID_BYTES:
        raise InvalidArgumentError(
            f"thread id is {len(raw)} bytes in UTF-8, more than {MAX_THREAD_ID_BYTES}; use a "
            "shorter id (for instance a UUID or a hash of the long one)"
        )
    return f"{HEADS}/" + base64.b32encode(raw).decode("ascii").rstrip("=").lower()


def thread_from_key(key: str) -> str | None:
    name = key.rsplit("/", 1)[-1].upper()
    try:
        return base64.b32decode(name + "=" * (-len(name) % 8)).decode("utf-8", "surrogatepass")
    except (ValueError, UnicodeDecodeError):
        return None


@dataclass(frozen=True, slots=True)
class Ref:
    head: Head
    version: str


def append(head: Head, entry: LogEntry, new: dict[ObjectId, bytes]) -> Head:
    """``head`` with ``entry`` appended and made the head; new segments are added to ``new``."""
    tail = head.tail + (entry,)
    peaks = head.peaks
    if len(tail) >= LEAF:
        data = Segment(0, entries=tail).encode()
        oid = object_id(data)
        new[oid] = data
        peaks += (Peak(oid, 0, len(tail)),)
        tail = ()
        while len(peaks) >= FANOUT and len({p.level for p in peaks[-FANOUT:]}) == 1:
            group = peaks[-FANOUT:]
            data = Segment(group[0].level + 1, children=tuple(p.id for p in group)).encode()
            oid = object_id(data)
            new[oid] = data
            peaks = peaks[:-FANOUT] + (Peak(oid, group[0].level + 1,
                                            sum(p.count for p in group)),)
    return Head(head.thread_id, entry.id, entry.step, peaks, tail)


def build(thread_id: str, entries: list[LogEntry], head_id: CheckpointId | None,
          new: dict[ObjectId, bytes]) -> Head:
    """A head holding exactly ``entries`` (in order), with ``head_id`` as its head."""
    head = Head(thread_id, None)
    for entry in entries:
        head = append(head, entry, new)
    step = next((e.step for e in entries if e.id == head_id), -1)
    return Head(thread_id, head_id if step >= 0 else None, step, head.peaks, head.tail)


class RefStore:
    """Reads and compare-and-swaps thread refs."""

    def __init__(self, backend: Backend, objects: ObjectStore) -> None:
        self.backend = backend
        self.objects = objects

    def read(self, thread_id: str) -> Ref | None:
        key = thread_key(thread_id)
        got = self.backend.read_ref(key)
        if got is None:
            return None
        head = Head.decode(got[0])
        if head.thread_id != thread_id:
            raise FormatError(
                f"ref {key} belongs to thread {head.thread_id!r}, not {thread_id!r}: the ref "
                "was copied or tampered with; run `cas-checkpoint verify`"
            )
        return Ref(head, got[1])

    def threads(self) -> list[str]:
        out = []
        for info in self.backend.list(HEADS):
            thread = thread_from_key(info.key)
            if thread is not None and info.key == thread_key(thread):
                out.append(thread)
        return sorted(out)

    def iter_newest_first(self, head: Head) -> Iterator[LogEntry]:
        """Entries newest first, reading segments lazily (one peak tree at a time)."""
        yield from reversed(head.tail)
        for peak in reversed(head.peaks):
            yield from reversed(self._read_trees([peak.id]))

    def holds(self, head: Head, entry: LogEntry) -> bool:
        """Whether the log of ``head`` has ``entry``: read newest first, stopping at the entry's
        parent (it would come after that)."""
        for seen in self.iter_newest_first(head):
            if seen.id == entry.id:
                return True
            if seen.id in entry.parents:
                return False
        return False

    def entries(self, head: Head) -> list[LogEntry]:
        """Every entry, oldest first: one round of parallel reads per tree level."""
        return self._read_trees([p.id for p in head.peaks]) + list(head.tail)

    def _read_trees(self, roots: list[ObjectId]) -> list[LogEntry]:
        segs: dict[ObjectId, Segment] = {}
        pending = list(dict.fromkeys(roots))
        while pending:
            got = self.objects.get_many(pending)
            children: list[ObjectId] = []
            for oid in pending:
                segs[oid] = seg = Segment.decode(got[oid])
                children.extend(seg.children)
            pending = [c for c in dict.fromkeys(children) if c not in segs]

        seen: set[ObjectId] = set()  # a segment named twice is hostile (and would explode)

        def flatten(oid: ObjectId, depth: int) -> Iterator[LogEntry]:
            seg = segs[oid]
            if seg.level >= depth or oid in seen:
                raise FormatError(f"log segment {oid} does not descend in level or is named "
                                  "twice; the thread's log is corrupt")
            seen.add(oid)
            if seg.level == 0:
                yield from seg.entries
            for child in seg.children:
                yield from flatten(child, seg.level)

        return [e for root in roots for e in flatten(root, 64)]

    def update(
        self,
        thread_id: str,
        change: Callable[[Ref | None], tuple[Head | None, dict[ObjectId, bytes]]],
        *,
        expected_head: CheckpointId | None | object = ...,
        current: Ref | None | object = ...,
        done: Callable[[Ref], bool] | None = None,
    ) -> Ref | None:
        """Compare-and-swap loop. ``change`` maps the current ref to a new head (None deletes
        the ref) and the new segments it needs; it is called again after a lost race. With
        ``expected_head``, a head that is not the expected one raises ConflictError.
        ``current`` is a ref the caller believes current (it may be stale: it is only a guess
        that saves a read). ``done(ref)``, asked after a lost race, says whether ``ref`` already
        holds the change (our write landed, its reply was lost, and another writer built on
        it): then the change is not applied twice. Returns the ref written (or the one found
        holding the change), or None when it was deleted."""
        key = thread_key(thread_id)
        fresh = current is ...
        ref = self.read(thread_id) if fresh else current
        for attempt in range(RETRIES):
            assert ref is None or isinstance(ref, Ref)
            actual = ref.head.head if ref else None
            if expected_head is not ... and actual != expected_head:
                if not fresh:
                    ref, fresh = self.read(thread_id), True
                    continue
                raise ConflictError(thread_id, expected_head, actual)  # type: ignore[arg-type]
            new_head, new_objects = change(ref)
            self.objects.put_many(new_objects)  # segments before the ref that names them
            try:
                if new_head is None:
                    if ref is not None:
                        self.backend.delete_ref(key, ref.version)
                    return None
                data = new_head.encode()
                return Ref(new_head, self.backend.write_ref(key, data,
                                                            ref.version if ref else None))
            except RefMismatch:
                log.debug("ref %s moved under us (attempt %d); re-reading", key, attempt + 1)
                if attempt:
                    time.sleep(random.uniform(0, min(RACE_WAIT, 0.002 * 2 ** min(attempt, 8))))
                ref, fresh = self.read(thread_id), True
                if done is not None and ref is not None and done(ref):
                    log.debug("ref %s already holds our change (a lost reply)", key)
                    return ref
        raise StorageError(
            f"thread {thread_id!r}: gave up after {RETRIES} lost compare-and-swap races; too many "
            "writers on one thread at once. Retry later or spread the writers over threads."
        )
