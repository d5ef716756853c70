"""A local ref file as two slots, so that a steady ref update costs one flush. Pure code.

A ref on local disk used to be its head's bytes, replaced by a temp file, ``fsync``,
``os.replace`` and an ``fsync`` of the folder: two flushes, each a journal commit for a new
inode or a new name. A *slotted* ref file holds the head in one of two slots of equal size
(a multiple of 4 KB), at offsets 0 and ``size / 2``::

    slot = b"CASR" | format (1) | seq (8, big-endian) | length (4) | checksum (32) | head
    checksum = BLAKE3(b"CASR" | format | seq | length | head)

The *live* slot is the valid slot (magic, format, length within the slot, checksum) with the
highest ``seq``. An update, under the ref's lock (``local.py``), writes ``seq + 1`` and the new
head into the other slot with ``pwrite``, ``fdatasync``s the file, then zeroes the old slot's
checksum (no flush needed: see below). Why this is as strong as temp + fsync + rename + folder
fsync:

* *Atomic for readers.* A reader never sees a part of a head as a head: a slot being written
  fails its checksum (a 32-byte BLAKE3 over everything it says), and the reader takes the other
  slot, which no writer touches while it is live (the slots never share a 4 KB block, so even a
  torn block write at power loss cannot reach it).
* *Durable when acknowledged.* The update returns after ``fdatasync``, which writes the slot's
  blocks and any metadata needed to read them back (the file's size never changes in place, so
  that is none: no journal commit, no new name to make durable). After power loss the new slot
  is whole (and live: its ``seq`` is higher), or the update was not acknowledged.
* *A crash at any point* leaves the old live slot intact, with at most a torn other slot: the
  next reader takes the old head, the next writer overwrites the torn slot.
* *The zeroed checksum* only makes a ref at rest hold one valid slot, so a damaged live slot is
  an error (``IntegrityError``), never a silent step back to the head before it. It is written
  after the new slot is durable; if power loss drops it, the old slot is valid but lower.
* *Compare-and-swap stays exact*: the version of a ref is the BLAKE3 of its head (as for a
  ref in one piece), read and compared under the lock.

A ref whose file does not yet exist, a ref in one piece (every store written before this
change, and refs copied in by hand: they are still read as before), and a head that does not
fit its slot are written whole as a new slotted file by temp + fsync + rename + folder fsync.
"""

from __future__ import annotations

import struct

import blake3

MAGIC = b"CASR"
FORMAT = 1
BLOCK = 4096
_HEADER = struct.Struct(">4sBQI32s")
HEADER = _HEADER.size  # 49 bytes
CHECKSUM_AT = HEADER - 32  # where a slot's checksum starts (zeroed to retire the slot)


def is_slotted(data: bytes | memoryview) -> bool:
    return bytes(data[:4]) == MAGIC


def _checksum(seq: int, head: bytes | memoryview) -> bytes:
    hasher = blake3.blake3(_HEADER.pack(MAGIC, FORMAT, seq, len(head), b"")[:CHECKSUM_AT])
    hasher.update(head)
    return hasher.digest()


def encode_slot(seq: int, head: bytes) -> bytes:
    """A slot's bytes (without its padding)."""
    return _HEADER.pack(MAGIC, FORMAT, seq, len(head), _checksum(seq, head)) + head


def checksum_of(slot: bytes) -> bytes:
    """The checksum an ``encode_slot`` result holds."""
    return slot[CHECKSUM_AT:HEADER]


def slot_size(head_len: int) -> int:
    """The slot size of a new slotted file for a head of ``head_len`` bytes: room to grow to
    twice its size before the file is rewritten, in whole 4 KB blocks."""
    need = 2 * (HEADER + head_len)
    return max(BLOCK, -(-need // BLOCK) * BLOCK)


def fits(slot: int, head_len: int) -> bool:
    """Whether a head of ``head_len`` bytes goes into a slot of ``slot`` bytes in place (and is
    not so small that the file had better be rewritten smaller)."""
    need = HEADER + head_len
    return need <= slot and not (slot > 16 * BLOCK and need * 8 < slot)


def new_file(seq: int, head: bytes) -> bytes:
    """A whole slotted file: ``head`` live in slot 0, slot 1 empty."""
    slot = slot_size(len(head))
    first = encode_slot(seq, head)
    return first + bytes(2 * slot - len(first))


def max_file(max_head: int) -> int:
    """The largest slotted file a head of at most ``max_head`` bytes can be in."""
    return 2 * slot_size(max_head)


class Live:
    """The live slot of a slotted file: which (0 or 1), its seq, the slot size, its head."""

    __slots__ = ("head", "index", "seq", "slot")

    def __init__(self, index: int, seq: int, slot: int, head: bytes) -> None:
        self.index, self.seq, self.slot, self.head = index, seq, slot, head


_RETIRED = bytes(32)


def live(data: bytes, known: tuple[int, bytes, bytes] | None = None) -> Live | None:
    """The live slot of a slotted file's bytes, or None when neither slot is valid (a torn
    read of a file being written, or a damaged file). Raises ValueError for a file whose size
    is not two whole slots (slotted files never change size in place: it is damaged).
    ``known``: (seq, checksum, head) of a slot this process wrote; a slot that holds exactly
    those needs no hashing (its checksum was computed from them)."""
    size = len(data)
    if size < 2 * BLOCK or size % (2 * BLOCK):
        raise ValueError(f"a slotted ref of {size} bytes (not two slots of whole 4 KB blocks)")
    slot = size // 2
    best: Live | None = None
    for index in (0, 1):
        at = index * slot
        magic, fmt, seq, length, checksum = _HEADER.unpack_from(data, at)
        if magic != MAGIC or fmt != FORMAT or length > slot - HEADER or checksum == _RETIRED:
            continue
        head = data[at + HEADER:at + HEADER + length]
        if (known is None or known[0] != seq or known[1] != checksum or known[2] != head) and (
                _checksum(seq, head) != checksum):
            continue
        if best is None or seq > best.seq:
            best = Live(index, seq, slot, head)
    return best
