"""What a build remembers between builds (``Memo``), so that a save does not hash or group again
what did not change. Pure code.
Rule: keyed by content, never by object identity."""

from __future__ import annotations

import bisect
from collections import OrderedDict
from dataclasses import dataclass, field

from cas_checkpoint.format.objects import ObjectId


@dataclass(slots=True)
class _SeqMemo:
    """A split list as last built: its items' bytes, where each item ends, and its leaves (one
    entry per leaf in each of the parallel lists). A long list's first ``regions`` leaves are
    its closed regions (one big leaf each); the others are the small leaves of its open region
    (all closed but perhaps the last), as are all the leaves of a short list."""

    body: bytes  # the encoded items, without the array header
    ends: list[int]  # end offset in ``body`` of each item
    uptos: list[int]  # items up to the end of each leaf
    ids: list[ObjectId]  # each leaf's id
    closed: list[bool]  # whether a cut closed it
    datas: list[bytes]  # each leaf's bytes
    counts: list[int]  # items in each leaf
    group_ends: list[int]  # end offset in ``body`` of each leaf
    long: bool  # cut in two tiers (closed regions, then the open region's small leaves)
    regions: int  # how many of the leaves are closed regions
    gen: int = -1  # ``Memo.gen`` whose ``lengths`` holds each leaf's count


@dataclass(slots=True)
class _Level:
    """One level of index nodes as last built: the children, and the closed groups of them
    (each one's end in ``children``, and the node made of it: id, bytes, length)."""

    children: list[ObjectId]
    ends: list[int]
    ids: list[ObjectId]
    datas: list[bytes]
    totals: list[int]
    gen: int = -1  # ``Memo.gen`` whose ``lengths`` holds each node's length


def _same_groups(level: list[ObjectId], old: _Level) -> int:
    """How many of ``old``'s closed groups ``level`` starts with (the same children up to the
    group's end): the largest such count, by bisection (a common prefix only grows)."""
    hi = bisect.bisect_right(old.ends, len(level))
    if hi and level[:old.ends[hi - 1]] == old.children[:old.ends[hi - 1]]:
        return hi  # (an append: every group that fits is the same, one comparison says so)
    lo = 0  # invariant: lo groups are the same; more than hi are not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        end = old.ends[mid - 1]
        if level[:end] == old.children[:end]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(slots=True)
class Memo:
    """What recent builds computed, keyed by content, so that a save does not hash again what
    did not change (``build(..., memo=)``). Content keys make it correct for any state: a list is
    reused only up to the first byte where its encoding differs from the one remembered.
    Bounded: it keeps the last ``SEQS`` split lists and ``INDEX`` index nodes."""

    SEQS = 64
    INDEX = 1 << 16
    seqs: OrderedDict[bytes, _SeqMemo] = field(default_factory=OrderedDict)
    index: OrderedDict[tuple[int | ObjectId, ...], tuple[ObjectId, bytes, int]] = field(
        default_factory=OrderedDict)  # (shape byte, *children) -> (id, bytes, length)
    levels: OrderedDict[tuple[int, bool, ObjectId], list[_Level]] = field(
        default_factory=OrderedDict)  # index levels by (shape, counted, first leaf)
    hits: int = 0  # list items reused without being hashed again
    # The length of each node built (items, pairs, characters or bytes of its part): a node's
    # id names its content, so an entry never goes stale and builds share the dict (a kept
    # leaf or group is not entered again). Replaced by an empty one (``gen`` + 1) when big.
    lengths: dict[ObjectId, int] = field(default_factory=dict)
    gen: int = 0

    LENGTHS = 1 << 16

    def lengths_for_build(self) -> dict[ObjectId, int]:
        """The shared lengths, emptied first when they hold over ``LENGTHS`` nodes (then the
        kept leaves and groups, of an older ``gen``, are entered again)."""
        if len(self.lengths) > self.LENGTHS:
            self.lengths = {}
            self.gen += 1
        return self.lengths

    def remember_seq(self, key: bytes, memo: _SeqMemo) -> None:
        self.seqs[key] = memo
        self.seqs.move_to_end(key)
        while len(self.seqs) > self.SEQS:
            self.seqs.popitem(last=False)

    def remember_levels(self, key: tuple[int, bool, ObjectId], levels: list[_Level]) -> None:
        self.levels[key] = levels
        self.levels.move_to_end(key)
        while len(self.levels) > self.SEQS:
            self.levels.popitem(last=False)


def _common_prefix(a: bytes | memoryview, b: bytes | memoryview) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (memcmp in 4 KB blocks)."""
    n, step, pos = min(len(a), len(b)), 4096, 0
    while pos < n and a[pos:pos + step] == b[pos:pos + step]:
        pos += step
    if pos >= n:
        return n
    lo, hi = pos, min(n, pos + step)  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo if a[lo:lo + 1] != b[lo:lo + 1] else hi
