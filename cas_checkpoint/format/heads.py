"""A thread's head (kind ``H``): the mutable ref of one thread, and the packs (``PackRef``) and
segment trees (``Peak``) it names, with their byte encoding. Pure code.

A long thread's head also names its archive (key ``a``: engine/archive.py) and the packs it
shares with another thread's ref (key ``x``: engine/collect.py); a head without them has the
eight keys it always had."""

from __future__ import annotations

from dataclasses import dataclass

import blake3
import msgpack

from cas_checkpoint.errors import IntegrityError, InvalidArgumentError
from cas_checkpoint.format.objects import (
    _HEADERS,
    HEAD,
    MAX_STEP,
    PACKED_MAX,
    CheckpointId,
    LogEntry,
    ObjectId,
    _bad,
    _bin_id,
    _list_header,
    _packed_entries,
    _unpack_entries,
    object_kind,
)


@dataclass(frozen=True, slots=True)
class Peak:
    """A complete segment tree in a head: its root id, level and number of entries."""

    id: ObjectId
    level: int
    count: int


@dataclass(frozen=True, slots=True)
class PackRef:
    """A pack a head names: its id (the hash of its bytes), merge level, bytes and objects."""

    id: ObjectId
    level: int
    size: int
    count: int


_PACKED_REFS: dict[PackRef, bytes] = {}  # by value: a PackRef's fields are all immutable


def _packed_ref(ref: PackRef) -> bytes:
    """``msgpack.packb([id, level, size, count])`` of a pack a head names, remembered."""
    got = _PACKED_REFS.get(ref)
    if got is None:
        got = msgpack.packb([_bin_id(ref.id), ref.level, ref.size, ref.count],
                            use_bin_type=True)
        if len(_PACKED_REFS) >= PACKED_MAX:
            _PACKED_REFS.clear()
        _PACKED_REFS[ref] = got
    return got


_PACKED_PEAKS: dict[int, tuple[tuple[Peak, ...], bytes]] = {}  # id(peaks) -> (them, bytes)


def _packed_peaks(peaks: tuple[Peak, ...]) -> bytes:
    """``msgpack.packb([[id, level, count], ...])`` of a head's peaks, remembered for the very
    same tuple (kept alive with its bytes, so its identity is not reused; a tuple of frozen
    peaks never changes): a commit carries its head's peaks over unchanged but when its log's
    tail becomes a segment (one commit in 16)."""
    got = _PACKED_PEAKS.get(id(peaks))
    if got is not None and got[0] is peaks:
        return got[1]
    data: bytes = msgpack.packb([[_bin_id(p.id), p.level, p.count] for p in peaks],
                                use_bin_type=True)
    if len(_PACKED_PEAKS) >= PACKED_MAX:
        _PACKED_PEAKS.clear()
    _PACKED_PEAKS[id(peaks)] = (peaks, data)
    return data


MAX_HEAD_BYTES = 4 << 20  # a ref larger than this is refused before it is read whole
MAX_HELD = 256  # packs a head marks as shared with another thread's ref (it names <= ~16)


@dataclass(frozen=True, slots=True)
class Head:
    """The mutable ref of one thread: current head, full segment trees (peaks), recent entries,
    and where the thread's objects are: the packs it names and the objects still ``inline``.

    ``lineage`` is set when the thread is created (and by a fork): while it stays the same, every
    object a head of the thread held is still held by its later heads (packs are only merged,
    never thinned), so a writer may skip writing what it saw there."""

    thread_id: str
    head: CheckpointId | None
    head_step: int = -1  # step of the head checkpoint, -1 when there is none
    peaks: tuple[Peak, ...] = ()
    tail: tuple[LogEntry, ...] = ()
    packs: tuple[PackRef, ...] = ()
    inline: tuple[bytes, ...] = ()
    lineage: bytes = b""
    archive: PackRef | None = None  # the pack listing the archived packs (archive.py)
    # packs it names that another thread's ref may name too (a fork's, a copy's, an
    # import's): its writers never delete them once they stop naming them (collect.py)
    held: frozenset[ObjectId] = frozenset()

    @property
    def count(self) -> int:
        return sum([p.count for p in self.peaks]) + len(self.tail)

    def storage(self, base: Head) -> Head:
        """This head with the packs, inline objects, lineage, archive and held packs of
        ``base`` (itself when it has them already: a commit's head mostly does)."""
        if (self.packs is base.packs and self.inline is base.inline
                and self.lineage is base.lineage and self.archive is base.archive
                and self.held is base.held):
            return self
        return Head(self.thread_id, self.head, self.head_step, self.peaks, self.tail,
                    base.packs, base.inline, base.lineage, base.archive, base.held)

    def encode(self) -> bytes:
        # The bytes of msgpack.packb({"t": ..., "h": ..., "s": ..., "p": ..., "e": ..., "k":
        # ..., "i": ..., "g": ...}), made of parts: a list's bytes are its header and then its
        # items' bytes, so the log tail's entries, the peaks and the pack list (which a save
        # mostly carries over unchanged) are each packed once, not on every save.
        first: bytes = msgpack.packb(
            ["t", self.thread_id, "h", None if self.head is None else _bin_id(self.head),
             "s", self.head_step, "p"], use_bin_type=True)
        last: bytes = msgpack.packb(["i", list(self.inline), "g", self.lineage],
                                    use_bin_type=True)
        keys = 8  # (keys a and x only in a head that has them: archive.py, collect.py)
        if self.archive is not None:
            last += b"\xa1a" + _packed_ref(self.archive)
            keys += 1
        if self.held:
            last += b"\xa1x" + msgpack.packb([_bin_id(p) for p in sorted(self.held)],
                                             use_bin_type=True)
            keys += 1
        body = b"".join((bytes([0x80 + keys]), first[1:], _packed_peaks(self.peaks), b"\xa1e",
                         _packed_entries(self.tail), b"\xa1k",
                         _list_header(len(self.packs)), *map(_packed_ref, self.packs),
                         last[1:]))
        global _ENCODED
        data = b"".join((_HEADERS[HEAD], blake3.blake3(body).digest(), body))
        _ENCODED = (data, self.packs)
        return data

    @staticmethod
    def decode(data: bytes | memoryview, path: str = "ref") -> Head:
        if len(data) > MAX_HEAD_BYTES:
            raise _bad(f"a ref of {len(data)} bytes is larger than any valid ref "
                       f"({MAX_HEAD_BYTES} bytes)")
        if bytes(data[:4]) == b"CASE":  # crypto.SEALED_HEAD: only its keys open it
            raise InvalidArgumentError(
                f"{path} is encrypted: this store was created with a key; open it with "
                "encryption=Key.from_env('CAS_KEY') (or encryption='keyless' for gc and a "
                "quick verify)")
        if object_kind(data) != HEAD:
            raise _bad("expected a thread head")
        view = memoryview(data)
        if len(view) < 5 + 32:
            raise _bad("truncated thread head")
        want, body = bytes(view[5:37]).hex(), view[37:]
        actual = blake3.blake3(body).hexdigest()
        if actual != want:
            raise IntegrityError(want, actual, path)
        try:
            raw = msgpack.unpackb(body, raw=False, strict_map_key=True, max_ext_len=0,
                                  use_list=True)
        except Exception as exc:
            raise _bad(f"cannot decode thread head: {exc}") from None
        if not isinstance(raw, dict) or set(raw) - {"a", "x"} != {
                "t", "h", "s", "p", "e", "k", "i", "g"}:
            raise _bad("head must be a map with keys t,h,s,p,e,k,i,g (and a, x)")
        thread, head, peaks, tail = raw["t"], raw["h"], raw["p"], raw["e"]
        step, packs, inline, lineage = raw["s"], raw["k"], raw["i"], raw["g"]
        if not isinstance(step, int) or isinstance(step, bool) or not -1 <= step < MAX_STEP:
            raise _bad(f"head step must be an int in [-1, {MAX_STEP})")
        if not isinstance(thread, str):
            raise _bad("head thread must be a string")
        if head is not None and (not isinstance(head, bytes) or len(head) != 32):
            raise _bad("head id must be 32 bytes or nil")
        if not all(isinstance(x, list) for x in (peaks, tail, packs, inline)):
            raise _bad("head peaks, tail, packs and inline objects must be lists")
        if not isinstance(lineage, bytes) or len(lineage) > 32:
            raise _bad("head lineage must be at most 32 bytes")
        out = []
        for p in peaks:  # (decoded msgpack: type() tests are isinstance's, without bool)
            if (type(p) is not list or len(p) != 3 or type(p[0]) is not bytes
                    or len(p[0]) != 32 or type(p[1]) is not int or not 0 <= p[1] < 64
                    or type(p[2]) is not int or not 0 <= p[2] < 1 << 62):
                raise _bad("head peak must be [32-byte id, level, count]")
            out.append(Peak(ObjectId(p[0].hex()), p[1], p[2]))
        refs = [_pack_ref(p) for p in packs]
        archive = _pack_ref(raw["a"]) if "a" in raw else None
        held = raw.get("x", [])
        if not isinstance(held, list) or len(held) > MAX_HELD or not all(map(_id32, held)):
            raise _bad(f"head held packs must be a list of at most {MAX_HELD} 32-byte ids")
        if set(map(type, inline)) - {bytes}:
            raise _bad("head inline objects must be byte strings")
        return Head(
            thread,
            None if head is None else CheckpointId(head.hex()),
            step,
            tuple(out),
            _unpack_entries(tail),
            tuple(refs),
            tuple(inline),
            lineage,
            archive,
            frozenset(ObjectId(h.hex()) for h in held),
        )


def named(head: Head) -> frozenset[ObjectId]:
    """The packs ``head`` names itself: its packs and its archive's pack."""
    out = {p.id for p in head.packs}
    if head.archive is not None:
        out.add(head.archive.id)
    return frozenset(out)


_ENCODED: tuple[bytes, tuple[PackRef, ...]] = (b"", ())  # the last head encoded, its packs


def packs_of(data: bytes, path: str = "ref") -> tuple[PackRef, ...]:
    """The packs a head's bytes name (an encrypted ref lists them in the clear). When ``data``
    is the very bytes object this process's last ``Head.encode`` returned (kept alive in
    ``_ENCODED``, so its identity is never another object's), they are that head's packs, and
    nothing is decoded: a save seals the head it just encoded. Any other bytes are decoded."""
    last = _ENCODED  # (one read: another thread may encode meanwhile)
    if last[0] is data:
        return last[1]
    return Head.decode(data, path).packs


def _pack_ref(p: object) -> PackRef:
    if (type(p) is not list or len(p) != 4 or type(p[0]) is not bytes or len(p[0]) != 32
            or type(p[1]) is not int or not 0 <= p[1] < 64  # (decoded msgpack: type() is
            or type(p[2]) is not int or not 0 <= p[2] < 1 << 62  # isinstance without bool)
            or type(p[3]) is not int or not 0 <= p[3] < 1 << 62):
        raise _bad("head pack must be [32-byte id, level, size, count]")
    return PackRef(ObjectId(p[0].hex()), p[1], p[2], p[3])


def _id32(v: object) -> bool:
    return isinstance(v, bytes) and len(v) == 32
