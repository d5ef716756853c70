"""docs/format.md is exact: a reader written from that page alone (msgpack, BLAKE3 and zstd, no
cas_checkpoint code) reads a local store this version wrote: settings, thread keys, slotted
refs, heads, packs, records, log entries and the nodes a checkpoint reaches."""

from __future__ import annotations

import base64
import struct
from pathlib import Path
from typing import Any

import blake3
import msgpack
import zstandard

from cas_checkpoint import CheckpointStore

SLOT = struct.Struct(">4sBQI32sQ")  # "CASR" | format | seq | length | checksum | next


def thread_key(thread_id: str) -> str:
    raw = thread_id.encode()
    if len(raw) > 80:
        return "h-" + blake3.blake3(raw).hexdigest()
    return base64.b32encode(raw).decode().lower().rstrip("=")


def live_head(data: bytes) -> bytes:
    valid = []
    for offset in (0, len(data) // 2):
        magic, fmt, seq, length, checksum, _next = SLOT.unpack_from(data, offset)
        head = data[offset + SLOT.size: offset + SLOT.size + length]
        if magic == b"CASR" and fmt == 2 and blake3.blake3(
                magic + bytes([fmt]) + struct.pack(">QI", seq, length) + head).digest() == checksum:
            valid.append((seq, head))
    return max(valid)[1]


def read_pack(data: bytes) -> dict[str, bytes]:
    assert data[:5] == b"CASP\x03"
    flags = data[5]
    assert flags & ~3 == 0
    (count,) = struct.unpack_from(">I", data, 6)
    prefixes = [data[10 + 4 * i: 14 + 4 * i] for i in range(count)]
    at = 10 + 4 * count
    width = "H" if flags & 1 else "I"
    lengths = struct.unpack_from(f">{count}{width}", data, at)
    body = data[at + struct.calcsize(f">{count}{width}"):]
    if flags & 2:
        body = zstandard.ZstdDecompressor().decompress(body, max_output_size=sum(lengths))
    assert len(body) == sum(lengths)
    out, pos = {}, 0
    for prefix, length in zip(prefixes, lengths, strict=True):
        obj = body[pos: pos + length]
        pos += length
        oid = blake3.blake3(obj).hexdigest()
        assert bytes.fromhex(oid)[:4] == prefix and obj[:3] == b"CAS" and obj[4] == 3
        out[oid] = obj
    return out


def varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def node_children(node: bytes) -> list[str]:
    assert node[:5] == b"CASN\x03"
    count, pos = varint(node, 5)
    return [node[pos + 32 * i: pos + 32 * (i + 1)].hex() for i in range(count)]


def test_a_reader_written_from_the_spec_reads_a_store(tmp_path: Path) -> None:
    store = CheckpointStore.open(str(tmp_path))
    thread = "support/agent-1"
    for turn in range(60):  # enough to flush packs, merge them and close log segments
        infos = store.save(thread, {"messages": [f"message {i} " * 20 for i in range(turn)],
                                    "turn": turn}, label=f"turn {turn}")
    settings = msgpack.unpackb((tmp_path / "cas-store").read_bytes())
    assert settings["cas_checkpoint"] == 3 and settings["compression"] == "zstd"
    assert set(settings) <= {"cas_checkpoint", "compression", "level", "encryption", "key_id",
                             "names"}

    ref = tmp_path / "refs" / "heads" / thread_key(thread)
    assert (tmp_path / "refs" / "heads" / (thread_key(thread) + ".lock")).exists()
    head = live_head(ref.read_bytes())
    assert head[:5] == b"CASH\x03" and blake3.blake3(head[37:]).digest() == head[5:37]
    body: dict[str, Any] = msgpack.unpackb(head[37:], raw=False)
    assert list(body) == ["t", "h", "s", "p", "e", "k", "i", "g"]
    assert body["t"] == thread and body["h"].hex() == infos.id and body["s"] == 59
    assert 0 <= len(body["e"]) <= 15 and body["p"] and body["k"]
    assert sum(p[2] for p in body["p"]) + len(body["e"]) == 60

    objects: dict[str, bytes] = {}
    for pid, level, size, count in body["k"]:
        data = (tmp_path / "packs" / pid.hex()[:2] / pid.hex()[2:]).read_bytes()
        assert blake3.blake3(data).digest() == pid and len(data) == size
        got = read_pack(data)
        assert len(got) == count and 0 <= level < 64
        objects.update(got)
    for obj in body["i"]:
        objects[blake3.blake3(obj).hexdigest()] = obj

    record = objects[infos.id]
    assert record[:5] == b"CASC\x03"
    fields = msgpack.unpackb(record[5:], raw=False)
    t, parents, root, step, created, size, label, tags, meta = fields[:9]
    assert (t, step, label, tags, meta) == (thread, 59, "turn 59", [], {})
    assert [p.hex() for p in parents] == [store.history(thread, limit=2)[1].id]
    # the root: a 32-byte id, or the node itself without its header
    node = objects[root.hex()] if len(root) == 32 else b"CASN\x03" + root
    todo, seen = node_children(node), 0
    while todo:
        child = objects[todo.pop()]  # every node a checkpoint reaches is in the head's packs
        todo.extend(node_children(child))
        seen += 1
    assert seen > 1

    newest = body["e"][-1]  # a log entry: id, parents (nil: the entry before it), step...
    assert newest[0].hex() == infos.id and newest[2] == 59 and newest[5] == "turn 59"
    assert body["e"][0][1] is not None and all(e[1] is None for e in body["e"][1:])
    for seg_id, level, _count in body["p"]:
        segment = msgpack.unpackb(objects[seg_id.hex()][5:], raw=False)
        assert segment["v"] == level and (("e" in segment) if level == 0 else ("c" in segment))
