"""Placeholders for child nodes inside codec bytes: ``Ref`` (one child) and ``Span`` (several
children joined into one value). Pure code."""

from __future__ import annotations

import dataclasses

from cas_checkpoint.errors import InvalidArgumentError


@dataclasses.dataclass(frozen=True, slots=True)
class Ref:
    """Placeholder for a child node: encodes as ext 12 holding ``index`` (non-negative int)."""

    index: int

    def __post_init__(self) -> None:
        if type(self.index) is not int or not 0 <= self.index < 1 << 64:
            raise InvalidArgumentError(f"Ref index must be an int in [0, 2**64): {self.index!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class Span:
    """Placeholder for children ``start .. start + count - 1`` of a node, joined into one value
    of ``shape`` (a list, dict, str... split over them): encodes as ext 14, or as ext 16 with
    ``lengths``: the length of each child's part (items of a list, pairs of a dict, characters
    of a str, bytes of a bytes), so that a reader knows where each part lies without reading
    it. Lengths are for navigation only: a reader checks them against the parts it reads."""

    shape: int
    start: int
    count: int
    lengths: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if type(self.shape) is not int or not 0 <= self.shape < 256 or any(
                type(v) is not int or not 0 <= v < 1 << 32 for v in (self.start, self.count)):
            raise InvalidArgumentError(f"invalid Span {self!r}")
        if self.lengths is not None and (
                type(self.lengths) is not tuple or len(self.lengths) != self.count
                or any(type(v) is not int or not 0 <= v < 1 << 32 for v in self.lengths)):
            raise InvalidArgumentError(f"a Span's lengths must be {self.count} ints in "
                                       f"[0, 2**32): {self.lengths!r}")


_SMALL = [bytes((n,)) for n in range(0x80)]


def varint(n: int) -> bytes:
    """``n`` (>= 0) as a LEB128 varint."""
    if 0 <= n < 0x80:
        return _SMALL[n]
    if 0 <= n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    out = bytearray()
    while True:  # LEB128
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def span_fields(data: bytes) -> tuple[int, int, int] | None:
    """(shape, start, count) of a Span payload (ext 14); None unless it is exactly two minimal
    varints."""
    got = read_varints(data, 1, 2) if data else None
    if got is None or got[1] != len(data):
        return None
    return data[0], got[0][0], got[0][1]


def counted_span_fields(data: bytes) -> tuple[int, int, int, tuple[int, ...]] | None:
    """(shape, start, count, lengths) of a counted Span payload (ext 16): a shape byte, start,
    count, then ``count`` lengths, all minimal varints (each below 2**32); None otherwise."""
    head = read_varints(data, 1, 2) if data else None
    if head is None:
        return None
    (start, count), pos = head
    if count > len(data) - pos:  # each length takes a byte at least: no big allocation
        return None
    got = read_varints(data, pos, count)
    if got is None or got[1] != len(data):
        return None
    return data[0], start, count, tuple(got[0])


def read_varints(data: bytes | memoryview, pos: int, n: int) -> tuple[list[int], int] | None:
    """``n`` minimal LEB128 varints (each below 2**32) from ``pos``, and where they end; None
    if one is cut off, too long, not minimal or too big."""
    out: list[int] = []
    for _ in range(n):
        got = read_varint(data, pos, 5)
        if got is None:
            return None
        value, end = got
        if end - pos > 1 and data[end - 1] == 0 or value >> 32:  # not minimal, or too big
            return None
        out.append(value)
        pos = end
    return out, pos


def read_varint(data: bytes | memoryview, pos: int, max_bytes: int) -> tuple[int, int] | None:
    """(value, end) of the LEB128 varint at ``pos``; None if it is cut off or longer than
    ``max_bytes``."""
    value, shift = 0, 0
    for end in range(pos, min(len(data), pos + max_bytes)):
        byte = data[end]
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, end + 1
    return None
