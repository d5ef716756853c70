"""Byte-level helpers of the tree build: a msgpack buffer's items without copying it, str/bin
headers, content-defined cuts of long text. Pure code."""

from __future__ import annotations

from itertools import compress
from typing import Any
from zlib import crc32

import msgpack

SCAN_DIRECT = 1 << 20  # encodings up to this size are walked in memory, bigger ones read along
JUMP_MIN = 16 * 1024  # in a big encoding, a str/bytes this long is stepped over by its header
TEXT_AVG_BITS = 13  # ~8 KB average text chunk
TEXT_MIN, TEXT_MAX = 2 * 1024, 64 * 1024
LEAF_MAX_ITEMS = 1024  # a leaf of list items or dict pairs ends at this many, at the latest


class _Chunks:
    """A file-like reader over a buffer, so an Unpacker that only skips over items holds a
    few KB of it at a time instead of a copy of the whole (a big state is not copied again)."""

    __slots__ = ("pos", "view")

    def __init__(self, data: bytes | memoryview) -> None:
        self.view, self.pos = memoryview(data), 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.view) if n < 0 else min(len(self.view), self.pos + n)
        out = bytes(self.view[self.pos:end])
        self.pos = end
        return out


def _scanner(data: bytes | memoryview) -> msgpack.Unpacker:
    """An Unpacker to walk over ``data``'s items (``skip``/``tell``), fed without a copy of
    ``data`` when it is big."""
    if len(data) <= SCAN_DIRECT:
        unpacker = msgpack.Unpacker(None, raw=False, max_buffer_size=len(data) + 1,
                                    strict_map_key=False)
        unpacker.feed(data)
        return unpacker
    return msgpack.Unpacker(_Chunks(data), raw=False, max_buffer_size=len(data) + 1,
                            strict_map_key=False, read_size=min(1 << 16, len(data) + 1))


class Walker:
    """Where each item of an encoded list or dict ends (``skip``, then ``tell``). In a big
    encoding, a long str or bytes item is stepped over by its header (the Unpacker would
    gather the whole item in its buffer, a copy of it, just to skip it)."""

    __slots__ = ("base", "unpacker", "view")

    def __init__(self, data: bytes | memoryview) -> None:
        self.view, self.base = memoryview(data), 0
        self.unpacker = _scanner(self.view)

    def tell(self) -> int:
        return self.base + int(self.unpacker.tell())

    def skip(self, value: Any = None) -> None:
        if (type(value) is str or type(value) is bytes) and len(value) >= JUMP_MIN \
                and len(self.view) > SCAN_DIRECT:
            pos = self.tell()
            self.base = pos + sum(text_size(self.view, pos))
            self.unpacker = _scanner(self.view[self.base:])
        else:
            self.unpacker.skip()


def text_size(data: memoryview, pos: int) -> tuple[int, int]:
    """(header, payload) bytes of the msgpack str or bin that starts at ``data[pos]``."""
    first = data[pos]
    if 0xA0 <= first <= 0xBF:
        return 1, first & 0x1F
    width = {0xD9: 1, 0xC4: 1, 0xDA: 2, 0xC5: 2, 0xDB: 4, 0xC6: 4}[first]  # (as codec writes)
    return 1 + width, int.from_bytes(data[pos + 1:pos + 1 + width], "big")


def text_header(n: int, is_str: bool) -> bytes:
    """The msgpack header of a str (or bin) of ``n`` bytes, as ``codec.encode`` writes it."""
    if is_str:
        if n < 32:
            return bytes([0xA0 | n])
        if n < 0x100:
            return bytes([0xD9, n])
        return bytes([0xDA]) + n.to_bytes(2, "big") if n < 0x10000 else \
            bytes([0xDB]) + n.to_bytes(4, "big")
    if n < 0x100:
        return bytes([0xC4, n])
    return bytes([0xC5]) + n.to_bytes(2, "big") if n < 0x10000 else \
        bytes([0xC6]) + n.to_bytes(4, "big")


def text_cuts(data: bytes | memoryview, utf8: bool) -> list[int]:
    """End offsets of content-defined chunks of ``data`` (FastCDC, by the ``fastcdc`` package's
    compiled chunker: ~2 GB/s), each moved forward to a UTF-8 character start for text."""
    if len(data) <= TEXT_MIN:
        return [len(data)] if data else []
    import fastcdc  # here, not at import: the package imports click (~5 ms a process)

    cuts: list[int] = []
    for chunk in fastcdc.fastcdc(data, TEXT_MIN, 1 << TEXT_AVG_BITS, TEXT_MAX):
        cut = chunk.offset + chunk.length
        if utf8:
            while cut < len(data) and (data[cut] & 0xC0) == 0x80:
                cut += 1
        if not cuts or cut > cuts[-1]:
            cuts.append(cut)
    if cuts[-1] != len(data):
        cuts.append(len(data))
    return cuts


def item_ends(data: bytes | memoryview, start: int, count: int) -> list[int]:
    """Where each of the ``count`` msgpack items that follow ``data[start]`` ends (offsets in
    ``data``), for a buffer walked in memory (up to ``SCAN_DIRECT``-sized ones): one C call
    per item, no Python loop body."""
    unpacker = msgpack.Unpacker(None, raw=False, max_buffer_size=len(data) - start + 1,
                                strict_map_key=False)
    unpacker.feed(memoryview(data)[start:])
    skip, tell = unpacker.skip, unpacker.tell
    return [tell() + start for _ in range(count) if skip() is None]  # (skip gives None)


def plain_cuts(data: bytes | memoryview, bounds: list[int], lo: int, hi: int, target: int,
               start: int | None = None) -> list[int]:
    """The leaves that plain items ``lo .. hi - 1`` close, as ``_Builder._groups`` cuts them:
    the end (an item number, exclusive) of each group that ends by content (after an item whose
    ``crc32`` falls under ``size / target`` of the range) or at ``LEAF_MAX_ITEMS`` items; the
    items after the last end are an open group. Item ``i`` is ``data[bounds[i]:bounds[i + 1]]``
    and groups start at ``lo``, or at ``start`` when given: then items ``start .. lo - 1`` are
    known to close nothing (an open group found earlier; they are not tested again)."""
    view = memoryview(data)
    full = 0xFFFFFFFF
    flags = [crc32(view[a:b]) * target < (b - a) * full
             for a, b in zip(bounds[lo:hi], bounds[lo + 1:hi + 1], strict=True)]
    cuts: list[int] = []
    first = lo if start is None else start
    for at in compress(range(lo + 1, hi + 1), flags):
        while at - first > LEAF_MAX_ITEMS:  # (a leaf also ends at its 1,024th item)
            first += LEAF_MAX_ITEMS
            cuts.append(first)
        cuts.append(at)
        first = at
    while hi - first >= LEAF_MAX_ITEMS:
        first += LEAF_MAX_ITEMS
        cuts.append(first)
    return cuts
