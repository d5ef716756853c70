"""What a thread's newest entries reach: the objects a cold read of its latest state takes out
of its packs (issue 29, "latest-state read <= SqliteSaver's"). Pure code.

A pack is one compressed body: a reader that wants one object of it decompresses all of it.
Merges gather a thread's history into a few big packs, and the newest state's objects are a few
percent of them, spread through every one (a chat's early messages are nodes the newest state
still names). So a merge (``staging.stage``) splits what it gathers in two: the objects that the
head's newest ``RECENT`` log entries reach (their log segments, their checkpoint records, the
state nodes under them) go to a small **live** pack, the rest to the history pack as before.
A cold read of the newest state then decompresses the live packs and the small new packs only
(``pack_reads.parse_pack``: a pack is decompressed when an object is first taken out of it).

A live pack is an ordinary pack: nothing in the format tells it apart but its merge level,
``LIVE`` + the level of the merge that made it (a writer's convention; readers ignore levels).
Merges treat a live pack as part of the history pack before it: a level's four packs merge as
before, live packs with them, so no object is written more often than without the split (the
objects are the same, in two packs instead of one). What was live and is no longer (a todo list
rewritten) moves to history at the next merge that takes its pack.

The walk is exact for the objects of the packs it is given: a node is never newer than the
nodes and records that name it (content addressing: a parent is made with or after its
children), so the packs a merge takes and those after them hold every path from the newest
entries down to their objects. An object it cannot see (damaged, in an older pack) only ends
that path: a split is a reader's shortcut, never a correctness matter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from cas_checkpoint.errors import FormatError
from cas_checkpoint.format.heads import Head, PackRef
from cas_checkpoint.format.objects import (
    CheckpointId,
    ObjectId,
    Record,
    Segment,
    decode_node,
)

LIVE = 32  # a live pack's merge level: LIVE + the level of the merge that made it
LEGACY = 63  # not a live pack's: older versions capped merge levels here (a merge reaches
# level 32 after 4^32 flushes, so no other level of theirs is 32 or more)
RECENT = 32  # the newest log entries whose objects a merge keeps apart (two leaves' worth)
MAX_REACHED = 1 << 16  # objects a walk visits, at most (a huge state: the rest is history)

Get = Callable[[ObjectId], "bytes | memoryview | None"]
"""An object by id, or None when it is not at hand (the walk does not go below it)."""


def is_live(p: PackRef) -> bool:
    """Whether a merge made ``p`` as the live part of its objects."""
    return LIVE <= p.level < LEGACY


def level(p: PackRef) -> int:
    """``p``'s merge level, a live pack's being that of the merge that made it."""
    return p.level - LIVE if is_live(p) else p.level


def newest(packs: Sequence[PackRef]) -> tuple[PackRef, ...]:
    """``packs`` less each history pack a live pack follows: those a cold read of the newest
    state reads (every other pack: unsplit ones, the small newest ones, the live ones)."""
    return tuple(p for i, p in enumerate(packs)
                 if is_live(p) or i + 1 == len(packs) or not is_live(packs[i + 1]))


def reached(head: Head, get: Get, recent: int = RECENT) -> set[ObjectId]:
    """The ids of the objects at hand (``get``) that ``head``'s newest ``recent`` log entries
    reach: the log segments read to find them, their records and their states' nodes."""
    out: set[ObjectId] = set()
    cids = [e.id for e in reversed(head.tail)][:recent]
    if len(cids) < recent:
        for cid in _older(head, get, out, recent - len(cids)):
            cids.append(cid)
    todo: list[ObjectId] = []
    for cid in cids:
        data = get(ObjectId(cid))
        if data is None:
            continue
        out.add(ObjectId(cid))
        try:
            todo.extend(Record.decode(data).children())
        except FormatError:
            continue
    while todo and len(out) < MAX_REACHED:
        oid = todo.pop()
        if oid in out:
            continue
        data = get(oid)
        if data is None:
            continue
        out.add(oid)
        try:
            todo.extend(decode_node(data)[0])
        except FormatError:
            continue
    return out


def _older(head: Head, get: Get, out: set[ObjectId], n: int) -> Iterator[CheckpointId]:
    """Up to ``n`` entries' ids of ``head``'s log segments, newest first (as a reader walks
    them: ``RefStore.iter_newest_first``), adding the segments read to ``out``."""
    for peak in reversed(head.peaks):
        stack = [peak.id]
        while stack:
            oid = stack.pop()
            data = get(oid)
            if data is None or oid in out or len(out) >= MAX_REACHED:
                continue
            out.add(oid)
            try:
                seg = Segment.decode(data)
            except FormatError:
                continue
            if seg.level == 0:
                for entry in reversed(seg.entries):
                    yield entry.id
                    n -= 1
                    if n <= 0:
                        return
            else:
                stack.extend(seg.children)  # (popped newest first)
