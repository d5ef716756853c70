"""Node shapes and the limits shared by ``tree`` (build) and ``join`` (load). Pure code.

Every node payload starts with a shape byte: ``VALUE`` (codec bytes of a value, whose ``Ref(i)``
stand for child ``i`` and whose ``Span(shape, i, n)`` for children ``i .. i+n-1`` joined), or a
concatenation (``LIST``, ``TUPLE``, ``DICT``, ``STR``, ``BYTES``) of its children in order.

The limits hold for any data: ``build`` refuses (SerializationError) every state that ``load``
would refuse (FormatError), so whatever a save accepts, a load returns.
"""

from __future__ import annotations

VALUE, LIST, TUPLE, DICT, STR, BYTES = range(6)

MAX_NEST = 56  # split values (over 1 KB) inside split values, at most: build refuses deeper
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


def array_header(n: int) -> bytes:
    return _header(n, 0x90, 0xDC, 0xDD)


def map_header(n: int) -> bytes:
    return _header(n, 0x80, 0xDE, 0xDF)
