"""A local ref file as two slots, so that a steady ref update costs one flush. Pure code."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import blake3

MAGIC = b"CASR"
FORMAT = 2  # what this version writes; format 1 slots (no ``next``) are still read
BLOCK = 4096
_HEADER1 = struct.Struct(">4sBQI32s")  # format 1: 49 bytes
_HEADER = struct.Struct(">4sBQI32sQ")
HEADER = _HEADER.size  # 57 bytes: where a format 2 slot's head starts
CHECKSUM_AT = _HEADER1.size - 32  # where a slot's checksum starts (zeroed to retire the slot)
NEXT_AT = _HEADER1.size  # where a format 2 slot's ``next`` starts (outside its checksum)
_RETIRED = bytes(32)


def _checksum(seq: int, head: bytes | memoryview) -> bytes:
    hasher = blake3.blake3(_HEADER.pack(MAGIC, FORMAT, seq, len(head), b"", 0)[:CHECKSUM_AT])
    hasher.update(head)
    return hasher.digest()


def _checksum1(seq: int, head: bytes | memoryview) -> bytes:
    hasher = blake3.blake3(_HEADER1.pack(MAGIC, 1, seq, len(head), b"")[:CHECKSUM_AT])
    hasher.update(head)
    return hasher.digest()


def encode_slot(seq: int, head: bytes) -> bytes:
    """A slot's bytes (without its padding)."""
    return _HEADER.pack(MAGIC, FORMAT, seq, len(head), _checksum(seq, head), 0) + head


def checksum_of(slot: bytes) -> bytes:
    """The checksum an ``encode_slot`` result holds."""
    return slot[CHECKSUM_AT:CHECKSUM_AT + 32]


def next_mark(seq: int) -> bytes:
    """What goes at ``NEXT_AT`` of the live slot once its successor ``seq`` is written."""
    return seq.to_bytes(8, "big")


def slot_size(head_len: int, new: bool = False) -> int:
    """The slot size of a slotted file for a head of ``head_len`` bytes, in whole 4 KB blocks:
    room to grow by a quarter before the file is rewritten, and a block more for a ``new`` ref
    (no file before). A head grows while its first checkpoints and inline objects come in,
    then stays within a band: room to double made a ref file ~4x its head, most of a LangGraph
    agent's store at 10-50 turns (a quarter costs the agent benchmark +0.3-0.9 flushes a turn
    of ~35, for ~1/4 fewer bytes; issue 29). A new ref's growth is by saves, not by a factor:
    the namespace ref a subgraph makes each turn grows by ~5 KB over its 4 saves (from 0.5 KB,
    or from 7.6 KB), and with a quarter alone its file was written whole twice (a temp file,
    2 flushes and a rename more than a slot update); room to double cost the agent benchmark
    11% more bytes at 50 turns (namespace refs that start at 20-40 KB)."""
    need = (HEADER + head_len) * 5 // 4 + (BLOCK if new else 0)
    return max(BLOCK, -(-need // BLOCK) * BLOCK)


def fits(slot: int, head_len: int) -> bool:
    """Whether a head of ``head_len`` bytes goes into a slot of ``slot`` bytes in place (and is
    not so small that the file had better be rewritten smaller)."""
    need = HEADER + head_len
    return need <= slot and not (slot > 16 * BLOCK and need * 8 < slot)


def new_file(seq: int, head: bytes, new: bool = False) -> bytes:
    """A whole slotted file: ``head`` live in slot 0, slot 1 retired (a header with seq 0 and
    no checksum), so that any slot without a header is damage. ``new``: the ref's first file
    (``slot_size``)."""
    slot = slot_size(len(head), new)
    first = encode_slot(seq, head)
    second = _HEADER.pack(MAGIC, FORMAT, 0, 0, _RETIRED, 0)
    return first + bytes(slot - len(first)) + second + bytes(slot - len(second))


def max_file(max_head: int) -> int:
    """The largest slotted file a head of at most ``max_head`` bytes can be in (slots with room
    to double, as earlier versions wrote them, included)."""
    need = 2 * (HEADER + max_head)
    return 2 * max(BLOCK, -(-need // BLOCK) * BLOCK)


def _shaped(size: int) -> bool:
    return size >= 2 * BLOCK and size % (2 * BLOCK) == 0


def is_slotted(data: bytes | memoryview) -> bool:
    """A slotted file: slot 0 starts with the magic, or (slot 0's first bytes damaged) the file
    is two whole slots and slot 1 starts with it. Anything else is a ref in one piece."""
    if bytes(data[:4]) == MAGIC:
        return True
    size = len(data)
    return _shaped(size) and bytes(data[size // 2:size // 2 + 4]) == MAGIC


class Live:
    """The live slot of a slotted file: which (0 or 1), its seq, the slot size, its head, its
    format."""

    __slots__ = ("fmt", "head", "index", "seq", "slot")

    def __init__(self, index: int, seq: int, slot: int, head: bytes, fmt: int = FORMAT) -> None:
        self.index, self.seq, self.slot, self.head, self.fmt = index, seq, slot, head, fmt


@dataclass(frozen=True, slots=True)
class Slot:
    """What one slot holds. ``state``: ``valid`` (a whole head), ``retired`` (a header with its
    checksum zeroed), ``torn`` (a header whose checksum fails: a write that never finished, or
    damage), ``blank`` (no header: zeros or other bytes)."""

    state: str
    seq: int = 0
    fmt: int = 0
    next: int = 0  # format 2: the seq of a successor written into the other slot, 0 if none
    head: bytes = b""
    zeros: bool = False  # (blank) its first block is all zeros


def _slot(data: bytes, at: int, slot: int,
          known: tuple[int, bytes, bytes] | None) -> Slot:
    if data[at:at + 4] != MAGIC or data[at + 4] not in (1, 2):
        return Slot("blank", zeros=not any(data[at:at + min(slot, BLOCK)]))
    fmt = data[at + 4]
    if fmt == 1:
        _magic, _fmt, seq, length, checksum = _HEADER1.unpack_from(data, at)
        nxt, start = 0, at + _HEADER1.size
    else:
        _magic, _fmt, seq, length, checksum, nxt = _HEADER.unpack_from(data, at)
        start = at + HEADER
    if checksum == _RETIRED:
        return Slot("retired", seq, fmt, nxt)
    if length > slot - (start - at):
        return Slot("torn", seq, fmt, nxt)
    head = data[start:start + length]
    if fmt == 2 and known is not None and (known[0], known[1], known[2]) == (
            seq, checksum, head):
        return Slot("valid", seq, fmt, nxt, head)  # exactly what this process wrote
    if (_checksum if fmt == 2 else _checksum1)(seq, head) != checksum:
        return Slot("torn", seq, fmt, nxt)
    return Slot("valid", seq, fmt, nxt, head)


@dataclass(frozen=True, slots=True)
class Reading:
    """Both slots of a slotted file, and what a reader makes of them: ``live`` (None when no
    slot is valid, or when ``error`` says why the valid one must not be read), and whether the
    file is at rest as a finished update leaves it (``settled``)."""

    slots: tuple[Slot, Slot]
    slot: int  # the slot size
    live: Live | None
    error: str | None
    settled: bool
    damaged: bool  # a slot holds bytes no write of ours leaves (not a torn, unfinished write)

    def describe(self, name: object = None) -> str:
        """``slot 0: ...; slot 1: ...``. ``name(head) -> str`` names a valid slot's head."""
        parts = []
        for index, s in enumerate(self.slots):
            if s.state == "valid":
                what = name(s.head) if callable(name) else f"a head of {len(s.head)} bytes"
                live = self.live is not None and self.live.index == index
                text = f"{what}, whole (seq {s.seq}{', live' if live else ''})"
            elif s.state == "retired":
                text = f"retired (seq {s.seq})"
            elif s.state == "torn":
                text = f"damaged or torn (says seq {s.seq}; fails its checksum)"
            else:
                text = ("damaged (zeroed first sector: no slot header)" if s.zeros
                        else "damaged (no slot header)")
            parts.append(f"slot {index}: {text}")
        return "; ".join(parts)


def read(data: bytes, known: tuple[int, bytes, bytes] | None = None) -> Reading:
    """Both slots of a slotted file's bytes, and its live slot. Raises ValueError for a file
    whose size is not two whole slots (slotted files never change size in place: damaged).
    ``known``: (seq, checksum, head) of a slot this process wrote; a slot that holds exactly
    those needs no hashing.

    The live slot is the valid one with the higher seq, except that a valid slot whose
    ``next`` names a successor the other slot does not hold whole, and did not withdraw (a
    retired header with that seq), is never read: that successor was written, flushed and
    perhaps acknowledged, and then damaged; reading the older head would be a silent step
    back (``error`` says so)."""
    size = len(data)
    if not _shaped(size):
        raise ValueError(f"a slotted ref of {size} bytes (not two slots of whole 4 KB blocks)")
    slot = size // 2
    pair = (_slot(data, 0, slot, known), _slot(data, slot, slot, known))
    valid = [i for i in (0, 1) if pair[i].state == "valid"]
    if not valid:
        return Reading(pair, slot, None, None, False,
                       any(s.state == "blank" for s in pair))
    best = max(valid, key=lambda i: pair[i].seq)
    v, o = pair[best], pair[1 - best]
    live = Live(best, v.seq, slot, v.head, v.fmt)
    if o.state == "valid":
        return Reading(pair, slot, live, None, False, False)  # a retire not (yet) done
    if v.next and v.next > v.seq and not (o.state == "retired" and o.seq == v.next):
        return Reading(pair, slot, None, (
            f"slot {1 - best} held a newer head (seq {v.next}) that slot {best} (seq {v.seq}) "
            "was superseded by, and it is damaged; the older head is not read in its place"),
            False, True)
    blank_ok = o.state == "blank" and o.zeros and v.fmt == 1 and best == 0  # old new files
    settled = o.state == "retired" or blank_ok
    damaged = (o.state == "blank" and not blank_ok) or (o.state == "torn" and o.seq < v.seq)
    return Reading(pair, slot, live, None, settled, damaged)


def live(data: bytes, known: tuple[int, bytes, bytes] | None = None) -> Live | None:
    """The live slot of a slotted file's bytes, or None when none may be read (``read``)."""
    return read(data, known).live
