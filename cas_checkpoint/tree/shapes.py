"""Node shapes and the limits shared by the tree's build and load. Pure code."""

from __future__ import annotations

from cas_checkpoint.errors import FormatError
from cas_checkpoint.format.placeholders import read_varints

VALUE, LIST, TUPLE, DICT, STR, BYTES = range(6)
COUNTED = 0x10  # added to a concatenation's shape byte: its children's lengths follow

MAX_NEST = 56  # split values (over 1 KB) inside split values, at most: build keeps a value
# deeper than this whole, inside one node (the codec's own limit of 1,023 list/dict levels holds
# inside it), so the depth of a tree stays bounded and no state the codec encodes is refused
MAX_DEPTH = 1024  # node levels a load follows (MAX_NEST x ~17 index levels fit under it)
MAX_STATE_BYTES = 512 * 1024 * 1024  # a state's encoding, at most (build refuses bigger)
EXPANSION = 512  # a state may encode to at most this many times its distinct node bytes
LOAD_BUDGET = 2 * MAX_STATE_BYTES  # node bytes a load may expand into, whatever records say


def _header(n: int, small: int, b16: int, b32: int) -> bytes:
    if n < 16:
        return bytes([small | n])
    if n < 0x10000:
        return bytes([b16]) + n.to_bytes(2, "big")
    return bytes([b32]) + n.to_bytes(4, "big")


_SMALL_ARRAYS = [bytes([0x90 | n]) for n in range(16)]  # (a save asks for ~11 headers,
_SMALL_MAPS = [bytes([0x80 | n]) for n in range(16)]  # mostly of fewer than 16 items)


def array_header(n: int) -> bytes:
    return _SMALL_ARRAYS[n] if 0 <= n < 16 else _header(n, 0x90, 0xDC, 0xDD)


def map_header(n: int) -> bytes:
    return _SMALL_MAPS[n] if 0 <= n < 16 else _header(n, 0x80, 0xDE, 0xDF)


def concat_lengths(oid: str, payload: memoryview | bytes, children: int
                   ) -> tuple[int, tuple[int, ...] | None]:
    """(shape, lengths of the children's parts or None) of a concatenation node's payload;
    FormatError unless it is one shape byte alone (written before lengths) or a counted shape
    byte and exactly one minimal varint per child."""
    byte = payload[0]
    shape = byte & ~COUNTED
    if not LIST <= shape <= BYTES:
        raise FormatError(f"state node {oid} has unknown shape {byte}; the node is corrupt, or "
                          "was written by a newer cas_checkpoint: upgrade to read it")
    if not byte & COUNTED:
        if len(payload) != 1:
            raise FormatError(f"state node {oid} (shape {byte}) has bytes after its shape; the "
                              "node is corrupt")
        return shape, None
    if len(payload) == children + 1 and max(payload[1:], default=0) < 0x80:
        return shape, tuple(payload[1:])  # one byte each (the common case): minimal varints
    got = read_varints(payload, 1, children) if children < len(payload) else None
    if got is None or got[1] != len(payload):
        raise FormatError(f"state node {oid} does not give exactly one length per child "
                          f"({children} children); the node is corrupt")
    return shape, tuple(got[0])
