"""A checkpoint's entry in its thread's log found by its step, reading O(log n) segments, not
the log from its newest entry back (issue 29: ``load(thread, checkpoint_id)`` of an old
checkpoint of a long thread walked and decoded every entry after it). Pure code.

A save appends an entry one step after the head's (``commit.py``: ``head_step + 1``), and every
edit keeps the head the log's newest entry and the log a subsequence of what it was (rewind and
fork cut it at the head, delete and retain drop entries): so along a log the steps increase.
The log's full leaves (``LEAF`` entries each) sit under complete segment trees (``FANOUT``
children a level), so leaf ``j`` is reached in one path down its peak, and a binary search over
the leaves by step reads about log2(leaves) leaves, each on one path.

The same search gives ``history(before=id)`` the entries older than ``id`` from its leaf on (a
page of a long history costs its own entries, not the walk down to it from the newest).

Nothing here is trusted: a log whose steps do not increase (written otherwise, or damaged) or
whose trees are not complete gives ``None`` (or, part way through ``older``, ``Unseekable``), and
the caller walks the log as before (which says what is wrong with it). An entry found is one the
log holds, so the answer is exact. ``InArchive`` passes through: the caller reads the whole view
and asks again."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain

from cas_checkpoint.engine.archive import InArchive
from cas_checkpoint.engine.object_store import View
from cas_checkpoint.engine.refs import FANOUT
from cas_checkpoint.errors import CasError
from cas_checkpoint.format.heads import Head
from cas_checkpoint.format.objects import CheckpointId, LogEntry, ObjectId, Record, Segment

MAX_PROBES = 128  # leaves a search reads, at most (log2 of any real log's leaves is < 64)


def step_of(view: View, cid: CheckpointId) -> int | None:
    """The step the record of ``cid`` gives (None when the view cannot read it; InArchive
    when it may be in the archive the view did not read)."""
    try:
        return Record.decode(view.get(cid)).step
    except InArchive:
        raise
    except CasError:
        return None


class Unseekable(Exception):
    """Internal: a leaf ``older`` reached cannot be read as a log's (the caller walks)."""


def find(head: Head, view: View | None, cid: CheckpointId, step: int) -> LogEntry | None:
    """The entry of ``cid`` (whose record says ``step``) in ``head``'s log, found by a binary
    search on the steps of its leaves; None when it is not found so (the caller walks)."""
    for entry in head.tail:
        if entry.id == cid:
            return entry
    got = _locate(head, view, cid, step)
    return None if got is None else got[2][got[3]]


def older(head: Head, view: View, cid: CheckpointId, step: int) -> Iterator[LogEntry] | None:
    """The entries older than ``cid`` (a full leaf's, whose record says ``step``), newest first,
    read a leaf at a time; None when ``cid`` is not found by the search. A leaf that cannot be
    read as a log's raises ``Unseekable`` part way."""
    got = _locate(head, view, cid, step)
    if got is None:
        return None
    leaves, index, entries, at = got
    return chain(reversed(entries[:at]), leaves.newest_first(index - 1))


def _locate(head: Head, view: View | None, cid: CheckpointId, step: int
            ) -> tuple[_Leaves, int, tuple[LogEntry, ...], int] | None:
    """(the leaves, the index of the leaf holding ``cid``, its entries, ``cid``'s place in
    them), by a binary search on steps; None when not found so."""
    if not head.peaks or view is None:
        return None
    if head.tail and step > head.tail[-1].step:
        return None
    leaves = _Leaves(head, view)
    lo, hi = 0, leaves.total - 1
    for probe in range(MAX_PROBES):
        if lo > hi:
            return None
        mid = hi if probe == 0 else (lo + hi) // 2  # the newest leaf first: where the head
        entries = leaves.get(mid)  # and recent checkpoints are, when the tail is short
        if not entries:
            return None
        if step < entries[0].step:
            hi = mid - 1
        elif step > entries[-1].step:
            lo = mid + 1
        else:
            at = next((i for i, e in enumerate(entries) if e.id == cid), None)
            return None if at is None else (leaves, mid, entries, at)
    return None


class _Leaves:
    """The full leaves of a head's log, by index (oldest first), each read on one path down its
    peak; segments read once per search."""

    def __init__(self, head: Head, view: View) -> None:
        self.view = view
        self.peaks = [(p.id, p.level, FANOUT ** p.level) for p in head.peaks]
        self.total = sum(n for *_, n in self.peaks)
        self.read: dict[ObjectId, Segment] = {}

    def segment(self, oid: ObjectId) -> Segment | None:
        got = self.read.get(oid)
        if got is None:
            try:
                got = Segment.decode(self.view.get(oid))
            except InArchive:
                raise
            except CasError:
                return None
            if got.level:  # (a path's upper segments: leaves are read once each)
                self.read[oid] = got
        return got

    def newest_first(self, index: int) -> Iterator[LogEntry]:
        """The entries of leaves ``index`` down to 0, newest first."""
        for i in range(index, -1, -1):
            entries = self.get(i)
            if not entries:
                raise Unseekable(i)
            yield from reversed(entries)

    def get(self, index: int) -> tuple[LogEntry, ...] | None:
        """The entries of leaf ``index``; None when the tree is not what a log's is."""
        for oid, level, count in self.peaks:
            if index >= count:
                index -= count
                continue
            seg = self.segment(oid)
            while seg is not None and seg.level == level and level > 0:
                if len(seg.children) != FANOUT:
                    return None
                below = FANOUT ** (level - 1)
                seg = self.segment(seg.children[index // below])
                index %= below
                level -= 1
            if seg is None or seg.level != 0 or level != 0 or not seg.entries:
                return None
            return seg.entries
        return None
