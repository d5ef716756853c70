"""Placeholders for child nodes inside codec bytes: ``Ref`` (one child) and ``Span`` (several
children joined into one value). Pure code; ``codec`` encodes them as ext types 12 and 14."""

from __future__ import annotations

import dataclasses

from .errors import InvalidArgumentError


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
    of ``shape`` (a list, dict, str... split over them): encodes as ext 14."""

    shape: int
    start: int
    count: int

    def __post_init__(self) -> None:
        if type(self.shape) is not int or not 0 <= self.shape < 256 or any(
                type(v) is not int or not 0 <= v < 1 << 32 for v in (self.start, self.count)):
            raise InvalidArgumentError(f"invalid Span {self!r}")


def varint(n: int) -> bytes:
    """``n`` (>= 0) as a LEB128 varint."""
    out = bytearray()
    while True:  # LEB128
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def span_fields(data: bytes) -> tuple[int, int, int] | None:
    """(shape, start, count) of a Span payload; None unless it is exactly two minimal varints."""
    if len(data) < 3:
        return None
    fields, pos = [data[0]], 1
    for _ in range(2):
        got = read_varint(data, pos, 5)
        if got is None:
            return None
        value, end = got
        if end - pos > 1 and data[end - 1] == 0:  # a trailing zero group: not minimal
            return None
        fields.append(value)
        pos = end
    return (fields[0], fields[1], fields[2]) if pos == len(data) else None


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
