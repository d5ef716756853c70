"""Object encodings (pure code): log entries name their parent by back-reference inside one
container; checkpoint records are arrays that may hold a small root node inline."""

from __future__ import annotations

import blake3
import msgpack
import pytest

from cas_checkpoint.errors import FormatError
from cas_checkpoint.format.heads import Head, Peak
from cas_checkpoint.format.objects import (
    INLINE_ROOT_MAX,
    CheckpointId,
    LogEntry,
    ObjectId,
    Record,
    Segment,
    decode_node,
    encode_node,
    inlinable,
    object_id,
)


def cid(n: int) -> CheckpointId:
    return CheckpointId(f"{n:064x}")


def chain(n: int, first_parents: tuple[CheckpointId, ...] = ()) -> tuple[LogEntry, ...]:
    """Entries 1..n, each the child of the one before (the first of ``first_parents``)."""
    out = []
    for i in range(1, n + 1):
        parents = first_parents if i == 1 else (cid(i - 1),)
        out.append(LogEntry(cid(i), parents, i, 1000.0 + i, 10 * i, None, (), {}))
    return tuple(out)


def test_back_references_only_for_the_previous_entry() -> None:
    e = chain(1)[0]
    assert e.pack(cid(7))[1] == []  # no parents: stays a list
    child = LogEntry(cid(2), (cid(1),), 2, 1.0, 1)
    assert child.pack(cid(1))[1] is None
    assert child.pack(None)[1] == [bytes.fromhex(cid(1))]
    assert child.pack(cid(9))[1] == [bytes.fromhex(cid(1))]  # not the previous entry
    merge = LogEntry(cid(3), (cid(2), cid(1)), 3, 1.0, 1)
    assert merge.pack(cid(2))[1] == [bytes.fromhex(cid(2)), bytes.fromhex(cid(1))]
    assert LogEntry.unpack(child.pack(cid(1)), cid(1)) == child
    with pytest.raises(FormatError, match="back-reference"):
        LogEntry.unpack(child.pack(cid(1)))


@pytest.mark.parametrize("first", [(), (cid(99),), (cid(98), cid(97))])
def test_segment_roundtrip_with_back_references(first: tuple[CheckpointId, ...]) -> None:
    entries = list(chain(16, first))
    # a fork-like entry whose parent is not the entry before it, and a merge
    entries[5] = LogEntry(cid(6), (cid(2),), 6, 1.0, 1, "lbl", ("t",), {"k": [1]})
    entries[9] = LogEntry(cid(10), (cid(9), cid(4)), 10, 1.0, 1)
    seg = Segment(0, entries=tuple(entries))
    data = seg.encode()
    assert Segment.decode(data) == seg
    raw = msgpack.unpackb(data[5:])["e"]
    nil = [i for i, r in enumerate(raw) if r[1] is None]
    assert nil == [i for i in range(1, 16) if i not in (5, 9)]
    assert raw[0][1] == [bytes.fromhex(p) for p in first]
    # every back-reference saves the 34-byte list of one id
    plain = msgpack.packb({"v": 0, "e": [e.pack() for e in entries]}, use_bin_type=True)
    assert len(plain) - len(data[5:]) == 34 * len(nil)


def test_head_roundtrip_with_back_references() -> None:
    tail = chain(5, (cid(50),))
    head = Head("t", tail[-1].id, 5, (Peak(ObjectId(cid(77)), 0, 16),), tail)
    data = head.encode()
    assert Head.decode(data) == head
    assert [r[1] is None for r in msgpack.unpackb(data[37:])["e"]] == [False] + [True] * 4
    # a tail moved into a segment encodes on its own: nothing depends on the head
    assert Segment.decode(Segment(0, entries=tail[2:]).encode()).entries == tail[2:]


@pytest.mark.parametrize(("entries", "packs"), [(0, 0), (1, 1), (5, 14), (15, 15), (17, 16),
                                              (300, 70000)])
def test_head_bytes_are_those_of_one_packb_call(entries: int, packs: int) -> None:
    """Head.encode packs its log tail and pack list once per entry and pack, and joins the
    parts: the bytes are exactly those of packing the whole map at once (the format), also for
    tails and pack lists longer than any head holds (16- and 32-bit array headers)."""
    from cas_checkpoint.format.heads import PackRef

    def whole(head: Head) -> bytes:
        body = msgpack.packb({
            "t": head.thread_id, "h": None if head.head is None else bytes.fromhex(head.head),
            "s": head.head_step, "p": [[bytes.fromhex(p.id), p.level, p.count] for p in head.peaks],
            "e": [e.pack(None if i == 0 else head.tail[i - 1].id) for i, e in enumerate(head.tail)],
            "k": [[bytes.fromhex(p.id), p.level, p.size, p.count] for p in head.packs],
            "i": list(head.inline), "g": head.lineage}, use_bin_type=True)
        return b"CASH\x03" + blake3.blake3(body).digest() + body

    tail = chain(entries, (cid(50),))
    pack_list = tuple(PackRef(ObjectId(cid(i % 40 + 1)), i % 5, 100 + i, i) for i in range(packs))
    peaks = (Peak(ObjectId(cid(77)), 0, 16),)
    for head in (Head("t", tail[-1].id if tail else None, entries, peaks, tail, pack_list,
                      (b"x" * 20, b"y"), b"lineage!"),
                 Head("t\u00e9", None)):
        assert head.encode() == whole(head) == head.encode()  # (twice: from what it remembered)
        if len(head.encode()) < 4 << 20:
            assert Head.decode(head.encode()) == head
    # an entry's bytes are the ones first encoded (its record's), also after its metadata dict
    # is changed by the caller who gave it
    meta: dict[str, object] = {"a": 1}
    entry = LogEntry(cid(1), (), 1, 1000.0, 10, None, (), meta)
    first = Head("t", entry.id, 1, (), (entry,)).encode()
    meta["a"] = 2
    assert Head("t", entry.id, 1, (), (entry,)).encode() == first


def _with_first_entry_nil(data: bytes, key: str) -> bytes:
    if data[3:4] == b"H":  # a head: header, checksum of the body, body
        body = msgpack.unpackb(data[37:])
        body[key][0][1] = None
        packed = msgpack.packb(body, use_bin_type=True)
        return data[:5] + blake3.blake3(packed).digest() + packed
    body = msgpack.unpackb(data[5:])
    body[key][0][1] = None
    return data[:5] + msgpack.packb(body, use_bin_type=True)


def test_back_reference_on_the_first_entry_is_malformed() -> None:
    seg = Segment(0, entries=chain(3, (cid(40),))).encode()
    with pytest.raises(FormatError, match="back-reference"):
        Segment.decode(_with_first_entry_nil(seg, "e"))
    head = Head("t", cid(3), 3, (), chain(3, (cid(40),))).encode()
    with pytest.raises(FormatError, match="back-reference"):
        Head.decode(_with_first_entry_nil(head, "e"))


def _record(root_node: bytes | None, root: ObjectId | None = None) -> Record:
    return Record("thread", (cid(1),), root or object_id(root_node or b""), 4, 123.5, 900,
                  "lbl", ("a", "b"), {"m": 1}, root_node)


def test_record_roundtrip_with_a_stored_root() -> None:
    rec = _record(None, ObjectId(cid(5)))
    data = rec.encode()
    assert Record.decode(data) == rec
    assert rec.children() == (cid(5),)
    body = msgpack.unpackb(data[5:])
    assert isinstance(body, list) and len(body) == 9 and body[2] == bytes.fromhex(cid(5))


@pytest.mark.parametrize("children", [0, 1, 3])
def test_record_roundtrip_with_an_inline_root(children: int) -> None:
    kids = tuple(ObjectId(cid(100 + i)) for i in range(children))
    node = encode_node(b"\x00\x81\xa1k\xd4\x01\x00" + b"x" * 40, kids)
    assert inlinable(node)
    rec = _record(node)
    data = rec.encode()
    back = Record.decode(data)
    assert back == rec and back.root == object_id(node) and back.root_node == node
    assert back.children() == kids
    stored = _record(None, rec.root).encode()  # the same record naming a stored root
    assert len(data) - len(stored) == (len(node) - 5) - 32  # the node's bytes, not its id
    assert bytes(decode_node(back.root_node)[1]) == bytes(decode_node(node)[1])


def test_inline_limits() -> None:
    assert inlinable(encode_node(b"\x00" + b"x" * (INLINE_ROOT_MAX - 7)))  # exactly the max
    assert not inlinable(encode_node(b"\x00" + b"x" * (INLINE_ROOT_MAX - 6)))
    assert not inlinable(encode_node(b"\x00" + b"x" * 30))  # a 32-byte body reads as an id
    assert inlinable(encode_node(b"\x00" + b"x" * 29))
    with pytest.raises(ValueError):
        _record(encode_node(b"\x00" + b"x" * 30)).encode()
    with pytest.raises(ValueError):
        _record(b"CASC\x03" + b"x" * 10).encode()  # not a node
    with pytest.raises(ValueError, match="hash"):
        _record(encode_node(b"\x00ab"), ObjectId(cid(1))).encode()


def _raw_record(body: list[object]) -> bytes:
    return b"CASC\x03" + msgpack.packb(body, use_bin_type=True)


GOOD = ["t", [], b"\x00\x00x", 0, 1.0, 3, None, [], {}]


@pytest.mark.parametrize("change, words", [
    ({2: b"\x05"}, "not a valid state node"),  # names 5 children in one byte
    ({2: b""}, "state root"),
    ({2: b"\x00" * INLINE_ROOT_MAX}, "state root"),
    ({2: "text"}, "state root"),
    ({0: 5}, "thread"),
    ({1: [b"short"]}, "parents"),
    ({3: -1}, "step"),
    ({7: "tag"}, "tags"),
])
def test_record_decode_is_strict(change: dict[int, object], words: str) -> None:
    assert Record.decode(_raw_record(GOOD)).root_node == b"CASN\x03\x00\x00x"
    body = list(GOOD)
    for i, v in change.items():
        body[i] = v
    with pytest.raises(FormatError, match=words):
        Record.decode(_raw_record(body))
    with pytest.raises(FormatError, match="9-item array"):
        Record.decode(_raw_record(GOOD[:8]))
    with pytest.raises(FormatError, match="9-item array"):
        Record.decode(b"CASC\x03" + msgpack.packb(dict(zip("tprnczlgm", GOOD, strict=True))))


def test_other_format_versions_are_refused_with_advice() -> None:
    good = Record("t", (), ObjectId("ab" * 32), 0, 1.0, 3).encode()
    for version, advice in ((2, "older cas_checkpoint"), (4, "upgrade")):
        with pytest.raises(FormatError, match=advice):
            Record.decode(good[:4] + bytes([version]) + good[5:])
    assert Record.decode(good).root == "ab" * 32
