"""State -> a tree of content-addressed nodes (structural sharing), a prolly tree. Pure code."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from operator import sub
from typing import Any
from zlib import crc32

from cas_checkpoint.errors import SerializationError
from cas_checkpoint.format import codec
from cas_checkpoint.format.objects import ObjectId, node_bytes, object_id
from cas_checkpoint.tree.cuts import (
    LEAF_MAX_ITEMS,
    SCAN_DIRECT,
    Walker,
    item_ends,
    plain_cuts,
    text_cuts,
    text_header,
    text_size,
)
from cas_checkpoint.tree.index import _SHAPES, Nodes, _Inline
from cas_checkpoint.tree.load import load
from cas_checkpoint.tree.memo import Memo, _common_prefix, _SeqMemo
from cas_checkpoint.tree.shapes import (
    BYTES,
    DICT,
    EXPANSION,
    LIST,
    MAX_DEPTH,
    MAX_NEST,
    MAX_STATE_BYTES,
    STR,
    TUPLE,
    VALUE,
    array_header,
    map_header,
)

__all__ = ["BYTES", "DICT", "LIST", "MAX_DEPTH", "STR", "TUPLE", "VALUE", "Built", "Encoded",
           "Memo", "build", "load", "text_cuts"]

SPLIT_MIN = 1024  # values encoding to more bytes than this are split
LEAF_TARGET = 256  # average leaf bytes; an item at least this big ends its leaf
LONG_LIST = 16  # a list of this many items or more is cut in two tiers (see sequence; 64 before
# session 16: a chat of 16-63 messages over ~16 KB was one leaf a message, 74 nodes for 52):
LONG_LEAF_TARGET = 16 * 1024  # closed regions: few, large leaves load fast
LONG_TAIL_TARGET = LEAF_TARGET  # the open region: cut as a short list is (same leaves)
BIG_ITEM = 64 * 1024  # a list item this big gets a subtree of its own
DICT_SPLIT_KEYS = 64  # a dict with more keys than this is split over its pairs
TEXT_SPLIT_MIN = 32 * 1024  # str/bytes longer than this are split with a rolling hash
MEMO_MAX = 16 * 1024 * 1024  # lists encoding to more than this are not remembered (memory)
REENCODE_MIN = 64 * 1024 * 1024  # a state encoding to more is encoded again at its exact size
_VALUE_BYTE = _SHAPES[VALUE]
_TEXT_LEAF = node_bytes((_VALUE_BYTE,))  # a node's header, no children, the VALUE shape
_ARRAY_HEADS = [array_header(n) for n in range(LEAF_MAX_ITEMS + 1)]
# Concatenations carry their children's lengths. Tests set this to False to write the layout
# of stores made before lengths existed (which every reader must still accept).
WRITE_LENGTHS = True


@dataclass(frozen=True, slots=True)
class Built:
    root: ObjectId
    objects: dict[ObjectId, bytes]  # every node of the tree, root included
    size: int  # encoded bytes of the whole state (as one blob)
    data: bytes | memoryview = b""  # the whole state's encoding (what the tree splits): bytes
    # up to MEMO_MAX, else a view of the encoder's buffer (not copied, dropped after the save)


class _Builder(Nodes):
    def __init__(self, types: codec.TypeRegistry | None, memo: Memo | None = None) -> None:
        self.types = types
        self.memo = memo
        self.objects: dict[ObjectId, bytes] = {}
        self.nest = 0  # split values inside split values, on the way down
        self.counted = WRITE_LENGTHS
        # of each part built: items, pairs, characters (with a memo: shared with its builds)
        self.lengths: dict[ObjectId, int] = memo.lengths_for_build() if memo is not None else {}
        self.gen = memo.gen if memo is not None else -1

    def subtree(self, value: Any, data: bytes | memoryview) -> ObjectId | _Inline:
        """A node (or an inline top node) whose value is ``value`` (``data`` encodes it)."""
        kind = type(value)
        if len(data) <= SPLIT_MIN or kind not in (list, tuple, dict, str, bytes) \
                or self.nest >= MAX_NEST:  # past the split limit: the rest is kept whole
            return self.node(VALUE, data)
        self.nest += 1
        try:
            if kind is list:
                return self.sequence(value, data, LIST)
            if kind is tuple:
                return self.sequence(value, codec.encode(list(value), types=self.types), TUPLE)
            if kind is dict:
                return self.mapping(value, data)
            if len(value) > TEXT_SPLIT_MIN:
                return self.text(value, data)
            return self.node(VALUE, data)
        finally:
            self.nest -= 1

    def sequence(self, value: list[Any], data: bytes | memoryview, shape: int) -> _Inline:
        if self.memo is not None and len(data) <= MEMO_MAX:
            got = self._sequence_memo(value, data, shape)
            if got is not None:
                return got
        walker = Walker(data)
        if walker.unpacker.read_array_header() != len(value):
            raise AssertionError("codec and msgpack disagree on a list's length")
        view = memoryview(data)  # item bytes are views: a big state is not copied again
        bounds = [walker.tell()]  # item i is view[bounds[i]:bounds[i + 1]]
        subtrees: dict[int, ObjectId | _Inline] = {}
        for at, item in enumerate(value):
            walker.skip(item)
            end = walker.tell()
            if end - bounds[-1] > BIG_ITEM and type(item) in (list, tuple, dict, str, bytes):
                subtrees[at] = self.subtree(item, view[bounds[-1]:end])
            bounds.append(end)
        long = len(value) >= LONG_LIST
        if not subtrees:  # plain items only (the common case): cut by C loops
            stops, closed = self._stops(view, bounds, 0, len(value), LONG_LEAF_TARGET if long
                                        else LEAF_TARGET)
            if long and closed < len(stops):  # the open region: small leaves
                stops.pop()
                stops += self._stops(view, bounds, stops[-1] if stops else 0, len(value),
                                     LONG_TAIL_TARGET)[0]
            return self._index(self._leaf_nodes(view, bounds, 0, stops)[0], shape)
        items: list[_Item] = [(b"", view[a:b], subtrees.get(i))
                              for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False))]
        if not long:
            return self._index(self._leaves(items, array_header), shape)
        # a long list: regions closed by a rarer boundary become one big leaf each (few nodes
        # to read); the last, open region is cut as usual (an append writes a small leaf)
        regions = self._groups(items, LONG_LEAF_TARGET)
        leaves = [self._leaf(region, array_header) for region in regions[:-1]]
        last = regions[-1] if regions else []
        if last and (self._cuts(last[-1], LONG_LEAF_TARGET) or len(last) >= LEAF_MAX_ITEMS):
            leaves.append(self._leaf(last, array_header))
        else:
            leaves += self._leaves(last, array_header, LONG_TAIL_TARGET)
        return self._index(leaves, shape)

    @staticmethod
    def _stops(data: bytes | memoryview, bounds: list[int], lo: int, hi: int, target: int
               ) -> tuple[list[int], int]:
        """The leaves of plain items ``lo .. hi - 1`` (item i is ``data[bounds[i]:bounds[i +
        1]]``) as the end (an item number, exclusive) of each, and how many of them are closed
        (all but perhaps the last): the groups of ``_groups``, found by ``scan.plain_cuts``."""
        stops = plain_cuts(data, bounds, lo, hi, target)
        closed = len(stops)
        if (stops[-1] if stops else lo) < hi:
            stops.append(hi)
        return stops, closed

    def _leaf_nodes(self, view: memoryview, bounds: list[int], lo: int, stops: list[int]
                    ) -> tuple[list[ObjectId], list[bytes]]:
        """The leaf node of plain items ``lo`` up to each stop in turn (the bytes ``_leaf``
        makes of them: a leaf's items lie one after another in the encoding), hashed; (ids,
        bytes)."""
        heads, hash_, starts = _ARRAY_HEADS, object_id, [lo, *stops]
        datas = [b"".join((_TEXT_LEAF, heads[b - a], view[bounds[a]:bounds[b]]))
                 for a, b in zip(starts, stops, strict=False)]
        ids = [hash_(d) for d in datas]
        self.objects.update(zip(ids, datas, strict=True))
        self.lengths.update(zip(ids, map(sub, stops, starts), strict=False))
        return ids, datas

    def _sequence_memo(self, value: list[Any], data: bytes | memoryview, shape: int
                       ) -> _Inline | None:
        """``sequence`` for a list of small items, reusing the leaves of the remembered list
        whose encoding starts the same way, and the item ends it found: an append scans and
        tests only the new items and hashes only the new (or changed) last leaf, and a region
        closing hashes that region's big leaf once. An edit in a closed region cuts again from
        that region's start."""
        memo = self.memo
        assert memo is not None
        n = len(value)
        long = n >= LONG_LIST
        head = array_header(n)  # the codec writes the shortest header
        if bytes(data[:len(head)]) != head:
            raise AssertionError("codec and msgpack disagree on a list's length")
        body = bytes(memoryview(data)[len(head):])  # the one copy (the memo keeps it)
        key = bytes([shape]) + body[:64]
        old = memo.seqs.get(key)
        # Leaves ``[:k]`` of ``old`` are kept (``regions`` of them closed regions). The cut
        # goes on from item ``base`` (the open region's start: groups of the rarer boundary
        # start there), its open small leaf starting at ``first``; the ends of items up to
        # ``known`` are known (those items lie in the common prefix) and close nothing.
        k = regions = base = first = known = 0
        if old is not None and old.long != long:
            old = None
        if old is not None:
            # (an append: the old items are a prefix of the new ones, one memcmp says so)
            same = len(old.body) if body.startswith(old.body) else _common_prefix(body, old.body)
            k = bisect.bisect_right(old.group_ends, same)  # leaves within the common prefix,
            if k and not old.closed[k - 1]:  # closed ones (only the last can be open)
                k -= 1
            regions = min(k, old.regions)
            base = old.uptos[regions - 1] if regions else 0
            first = old.uptos[k - 1] if k else 0
            # (after an edit in a closed region only its start is known)
            known = bisect.bisect_right(old.ends, same) if k >= old.regions else base
        if old is not None:
            uptos, ids, closes = old.uptos[:k], old.ids[:k], old.closed[:k]
            datas, counts, group_ends = old.datas[:k], old.counts[:k], old.group_ends[:k]
            ends = old.ends[:known]
            memo.hits += known
        else:
            uptos, ids, closes, datas, counts, group_ends, ends = [], [], [], [], [], [], []
        offset = ends[-1] if ends else 0
        new = item_ends(body, offset, n - known)
        if new and max(map(sub, new, [offset, *new])) > BIG_ITEM:
            return None  # a big item gets a subtree of its own: the plain path does that
        # item base + i is body[bounds[i]:bounds[i + 1]]; stops below count from base
        bounds = [ends[base - 1] if base else 0, *ends[base:], *new]
        ends += new
        lo, hi, start = known - base, n - base, first - base
        cut = plain_cuts(body, bounds, lo, hi, LONG_LEAF_TARGET, 0) if long else []
        if cut:  # the open region closes (its small leaves give way to big ones)
            del uptos[regions:], ids[regions:], closes[regions:]
            del datas[regions:], counts[regions:], group_ends[regions:]
            start = 0
            lo = cut[-1]
        fine = plain_cuts(body, bounds, lo, hi, LONG_TAIL_TARGET if long else LEAF_TARGET,
                          lo if cut else start)
        stops = cut + fine
        if (stops[-1] if stops else start) < hi:
            stops.append(hi)
        if ids and (old is None or old.gen != self.gen):
            self.lengths.update(zip(ids, counts, strict=True))
        # the leaves kept: their bytes (C loops: an append costs little per leaf)
        self.objects.update(zip(ids, datas, strict=True))
        got, got_datas = self._leaf_nodes(memoryview(body), bounds, start, stops)
        ids += got
        datas += got_datas
        counts += map(sub, stops, [start, *stops])
        uptos += [base + b for b in stops]
        closes += [True] * (len(cut) + len(fine)) + [False] * (len(stops) - len(cut) - len(fine))
        group_ends += [bounds[b] for b in stops]
        memo.remember_seq(key, _SeqMemo(body, ends, uptos, ids, closes, datas, counts,
                                        group_ends, long, regions + len(cut), self.gen))
        return self._index(ids, shape)

    def mapping(self, value: dict[Any, Any], data: bytes | memoryview) -> ObjectId | _Inline:
        view = memoryview(data)
        pairs: list[_Item] = []
        if len(view) <= SCAN_DIRECT:  # where each key and value ends, in one C loop
            head = map_header(len(value))
            if bytes(view[:len(head)]) != head:
                raise AssertionError("codec and msgpack disagree on a dict's length")
            ends = item_ends(view, len(head), 2 * len(value))
            starts = [len(head), *ends[1::2]]
            for item, pos, mid, end in zip(value.values(), starts, ends[::2], ends[1::2],
                                           strict=False):
                raw = view[mid:end]
                big = len(raw) > SPLIT_MIN and type(item) in (list, tuple, dict, str, bytes)
                pairs.append((view[pos:mid], raw, self.subtree(item, raw) if big else None))
        else:
            walker = Walker(data)
            if walker.unpacker.read_map_header() != len(value):
                raise AssertionError("codec and msgpack disagree on a dict's length")
            pos = walker.tell()
            for item in value.values():
                walker.skip()
                mid = walker.tell()
                walker.skip(item)
                end = walker.tell()
                raw = view[mid:end]
                big = len(raw) > SPLIT_MIN and type(item) in (list, tuple, dict, str, bytes)
                pairs.append((view[pos:mid], raw, self.subtree(item, raw) if big else None))
                pos = end
        if len(pairs) <= DICT_SPLIT_KEYS:
            return self._leaf(pairs, map_header)
        return self._index(self._leaves(pairs, map_header), DICT)

    def text(self, value: str | bytes, data: bytes | memoryview) -> _Inline:
        """``value`` (``data`` encodes it) cut into leaves, taken from ``data`` (not copied
        first: each leaf's bytes are joined once, into its node)."""
        is_str = isinstance(value, str)
        view = memoryview(data)
        header, size = text_size(view, 0)
        raw = view[header:header + size]
        chars = not is_str or value.isascii()  # a piece's length is its byte count
        start, leaves = 0, []
        objects, lengths = self.objects, self.lengths
        for cut in text_cuts(raw, is_str):
            piece = raw[start:cut]  # its encoding: a str/bin header, then the bytes themselves
            # a leaf node without children: node_bytes((_VALUE_BYTE, header, piece)), inlined
            leaf_data = b"".join((_TEXT_LEAF, text_header(cut - start, is_str), piece))
            leaf = object_id(leaf_data)
            objects[leaf] = leaf_data
            lengths[leaf] = cut - start if chars else len(str(piece, "utf-8"))
            leaves.append(leaf)
            start = cut
        return self._index(leaves, STR if is_str else BYTES)

    def _leaf(self, items: list[_Item], header: Callable[[int], bytes]) -> ObjectId:
        children: list[ObjectId] = []
        parts: list[bytes | memoryview] = [_VALUE_BYTE, header(len(items))]
        for prefix, raw, child in items:
            parts.append(prefix)
            if child is None:
                parts.append(raw)
            elif isinstance(child, _Inline):
                span = codec.Span(child.shape, len(children), len(child.children),
                                  child.lengths if self.counted else None)
                parts.append(codec.encode_link(span))
                children.extend(child.children)
            else:
                parts.append(codec.encode_link(codec.Ref(len(children))))
                children.append(child)
        leaf = self.node_of(parts, children)
        self.lengths[leaf] = len(items)
        return leaf

    @staticmethod
    def _cuts(item: _Item, target: int) -> bool:
        """Whether a leaf ends after ``item``: with probability size / target, by content."""
        prefix, raw, child = item
        weight = 64 if child is not None else len(prefix) + len(raw)
        if isinstance(child, _Inline):
            child = child.oid
        h = crc32(bytes.fromhex(child) if child is not None else raw, crc32(prefix))
        return h * target < weight * 0xFFFFFFFF

    def _groups(self, items: list[_Item], target: int) -> list[list[_Item]]:
        groups: list[list[_Item]] = []
        group: list[_Item] = []
        for item in items:
            group.append(item)
            if self._cuts(item, target) or len(group) >= LEAF_MAX_ITEMS:
                groups.append(group)
                group = []
        if group:
            groups.append(group)
        return groups

    def _leaves(self, items: list[_Item], header: Callable[[int], bytes],
                target: int = LEAF_TARGET) -> list[ObjectId]:
        return [self._leaf(group, header) for group in self._groups(items, target)]

# (dict key or b"", value, subtree): the bytes are views into the state's encoding
_Item = tuple[bytes | memoryview, bytes | memoryview, ObjectId | _Inline | None]


@dataclass(frozen=True, slots=True)
class Encoded:
    """A state with its encoding, made by the caller (``codec.encode_nested``'s pieces, joined):
    ``build`` splits ``data`` instead of encoding ``value`` again. ``data`` must be exactly
    ``codec.encode(value)``'s bytes (a caller that reuses the encodings of unchanged parts
    answers for that: the LangGraph saver's ``integrations/langgraph/encode.py``)."""

    value: Any
    data: bytes


def build(value: Any, types: codec.TypeRegistry | None = None, memo: Memo | None = None
          ) -> Built:
    """Encode a state into nodes (SerializationError before anything is written). With a
    ``memo``, what an earlier build of the same content hashed is reused, not hashed again.
    An ``Encoded`` state is split from the encoding it carries."""
    if type(value) is Encoded:
        return _build(value.value, value.data, types, memo)
    data: bytes | memoryview = codec.encode_view(value, types=types)
    if len(data) > REENCODE_MIN:  # msgpack's buffer (up to 2x) is not held with the leaves:
        size, data = len(data), b""  # encoded again at its size (~0.5 ms a MB), peak ~2x
        data = codec.encode_view(value, types=types, size=size)
    if len(data) <= MEMO_MAX:
        data = bytes(data)  # small enough to keep (a copy, as encode makes)
    return _build(value, data, types, memo)


def _build(value: Any, data: bytes | memoryview, types: codec.TypeRegistry | None,
           memo: Memo | None) -> Built:
    if len(data) > MAX_STATE_BYTES:
        raise SerializationError(
            f"cannot store the state: it encodes to {len(data)} bytes, more than the "
            f"{MAX_STATE_BYTES} a checkpoint may hold; keep large blobs outside the state")
    builder = _Builder(types, memo)
    top = builder.subtree(value, data)
    root = top if isinstance(top, str) else builder.concat(top.shape, top.children)
    # (a state of at most 512 KB cannot trip this: skip the sum)
    distinct = sum(map(len, builder.objects.values())) if len(data) > 1 << 19 else 0
    if len(data) > EXPANSION // 2 * distinct + (1 << 19):  # load allows twice as much
        raise SerializationError(
            f"cannot store the state: it repeats the same values more than {EXPANSION // 2} "
            f"times over ({len(data)} bytes from {distinct} distinct bytes), which a load "
            "refuses as a possible decompression bomb; store one copy and refer to it")
    return Built(root, builder.objects, len(data), data)
