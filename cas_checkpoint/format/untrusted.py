"""msgpack records from untrusted bytes (bundles, object and head bodies), decoded within a
budget. Pure code.
Rule: a body's values and depth are counted before anything is built."""

from __future__ import annotations

from typing import Any

import msgpack

from cas_checkpoint.errors import FormatError

MAX_DEPTH = 512  # containers deep: msgpack.packb refuses deeper values, so no writer makes them

# bytes after the type byte that a value of fixed size takes (ints, floats, fixext with its type)
_FIXED = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8,
          0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8, 0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17}
# str, bin and ext whose length follows in 1, 2 or 4 bytes (ext: then a type byte)
_SIZED = {0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0), 0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0),
          0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1)}
# arrays and maps whose count follows in 2 or 4 bytes (a map's count is doubled: keys, values)
_COUNTED = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}


class TooBig(FormatError):
    """An untrusted body holds more values, or deeper containers, than its kind allows."""


def count(data: bytes | memoryview, max_items: int, max_depth: int = MAX_DEPTH) -> int:
    """How many values (map keys included) the one msgpack value at the start of ``data``
    holds; ``TooBig`` past ``max_items`` or ``max_depth``, ``FormatError`` if it is not one
    whole value. Nothing is built: the walk only reads type bytes and lengths."""
    buf = data if isinstance(data, bytes) else bytes(data)
    end, pos, items, left = len(buf), 0, 0, 1
    stack: list[int] = []
    while True:
        if not left:
            if not stack:
                break
            left = stack.pop()
            continue
        left -= 1
        items += 1
        if items > max_items:
            raise TooBig(f"it holds more than {max_items} values")
        if pos >= end:
            raise FormatError("it ends inside a value")
        b = buf[pos]
        pos += 1
        if b <= 0x7F or b >= 0xE0:  # fixint
            continue
        if b <= 0x8F:
            n = (b & 0x0F) * 2
        elif b <= 0x9F:
            n = b & 0x0F
        elif b <= 0xBF:
            pos += b & 0x1F
            continue
        elif b in _FIXED:
            pos += _FIXED[b]
            continue
        elif b in _SIZED:
            width, extra = _SIZED[b]
            pos += width + extra + int.from_bytes(buf[pos:pos + width], "big")
            continue
        elif b in _COUNTED:
            width, per = _COUNTED[b]
            n = per * int.from_bytes(buf[pos:pos + width], "big")
            pos += width
        else:
            raise FormatError(f"byte 0x{b:02x} starts no msgpack value")
        if n:
            if len(stack) >= max_depth:
                raise TooBig(f"its containers nest deeper than {max_depth} levels")
            stack.append(left)
            left = n
    if pos > end:
        raise FormatError("it ends inside a value")
    if pos != end:
        raise FormatError(f"{end - pos} bytes follow its value")
    return items


def unpack(data: bytes | memoryview, what: str, max_items: int) -> Any:
    """The value of ``data`` (str map keys, no ext types), decoded only if it holds at most
    ``max_items`` values; else a ``FormatError`` that names ``what`` and says why."""
    try:
        count(data, max_items)
        return msgpack.unpackb(data, raw=False, strict_map_key=True, max_ext_len=0,
                               use_list=True)
    except TooBig as exc:
        raise TooBig(f"{what} is larger than any valid one: {exc}; it is damaged or was not "
                     "written by cas_checkpoint") from None
    except Exception as exc:  # msgpack raises many kinds on hostile bytes
        raise FormatError(f"{what} does not decode ({exc}); it is damaged or was not written "
                          "by cas_checkpoint") from None


__all__ = ["MAX_DEPTH", "TooBig", "count", "unpack"]
