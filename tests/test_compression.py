"""zstd-compressed packs: round trips on every backend, sharing unchanged (objects keep their
names), the store's settings kept and enforced, damaged and hostile compressed packs refused."""

from __future__ import annotations

import os
import struct
from datetime import timedelta
from functools import partial
from typing import Any

import msgpack
import pytest
from builders import msg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cas_checkpoint import (
    CasError,
    CheckpointStore,
    FormatError,
    IntegrityError,
    InvalidArgumentError,
)
from cas_checkpoint.engine.object_store import parse_pack
from cas_checkpoint.engine.settings import MARKER, Settings
from cas_checkpoint.format.objects import NODE, ObjectId, object_id, object_kind
from cas_checkpoint.format.pack import SMALL_BODY, ZSTD, Zstd, decode_pack, encode_pack, open_pack

_msg = partial(msg, text="the refund policy covers annual plans ", times=9)


def _grow(store: CheckpointStore, thread: str, n: int) -> dict[str, Any]:
    state: dict[str, Any] = {"messages": [], "step": 0}
    for i in range(n):
        state["messages"].append(_msg(i))
        state["step"] = i
        store.save(thread, state)
    return state


def _packs(store: CheckpointStore) -> dict[str, bytes]:
    return {i.key: store.backend.get(i.key) for i in store.backend.list("packs")}


def _nodes(store: CheckpointStore) -> set[str]:
    out: set[str] = set()
    for data in _packs(store).values():
        out |= {oid for oid, obj in decode_pack(data).items() if object_kind(obj) == NODE}
    return out


def _inline_nodes(store: CheckpointStore, thread: str) -> set[str]:
    ref = store.refs.read(thread)
    assert ref is not None
    return {object_id(obj) for obj in ref.head.inline if object_kind(obj) == NODE}


VALUES: list[Any] = [None, True, 1 << 62, -7, 3.5, "ü" * 5000, b"\x00\xff" * 40000,
                     [1, [2, [3]]], (1, "a"), {"k": {"x": [b"1"] * 3}}, set(), frozenset({1}),
                     {"messages": [_msg(i) for i in range(300)]}, "x" * 200_000]


def test_round_trips_with_compression(make_store: Any) -> None:
    store = make_store(compression="zstd")
    for i, value in enumerate(VALUES):
        store.save("t", {"v": value, "i": i})
    fresh = CheckpointStore.open(store.url, storage_options=_opts(store))
    for info, value in zip(reversed(fresh.history("t")), VALUES, strict=True):
        assert fresh.load("t", info.id).state == {"v": value, "i": info.step}
    packs = _packs(store)
    assert packs and any(data[5] & ZSTD for data in packs.values())
    assert fresh.verify(deep=True).ok


def _opts(store: CheckpointStore) -> dict[str, Any]:
    fs = getattr(store.backend, "fs", None)
    return dict(fs.storage_options) if store.url.startswith("s3://") and fs else {}


def _content_bytes(store: CheckpointStore) -> int:
    """Bytes of the packs and of the heads: what compression can shrink (a local ref file
    holds its head in one of two slots of whole 4 KB blocks, a fixed cost per thread)."""
    refs = [store.backend.read_ref(i.key) for i in store.backend.list("refs/heads")]
    return (sum(i.size for i in store.backend.list("packs"))
            + sum(len(r[0]) for r in refs if r is not None))


def test_sharing_holds_and_bytes_shrink(tmp_path: Any) -> None:
    plain = CheckpointStore.open(str(tmp_path / "plain"), compression="none")
    packed = CheckpointStore.open(str(tmp_path / "zstd"), compression="zstd")
    for store in (plain, packed):
        _grow(store, "t", 120)
        store.fork("t", store.history("t")[60].id, "f")
        store.repack()
        store.gc(grace=timedelta(0))
    assert _nodes(plain) == _nodes(packed)  # the same objects, named by their plain bytes
    assert _content_bytes(packed) * 3 < _content_bytes(plain)
    assert packed.storage_bytes() < plain.storage_bytes()
    assert packed.load("f").state == plain.load("f").state
    # a second thread saving the same state writes only its record and log, never the nodes
    # (those its packs already hold; the newest few may still be inline in t's head, which
    # "copy" cannot name, so it writes them again: they count as held)
    before, held = _nodes(packed), _inline_nodes(packed, "t")
    packed.save("copy", packed.load("t").state)
    packed.repack()
    assert before <= _nodes(packed) <= before | held


def test_settings_are_kept_and_enforced(tmp_path: Any) -> None:
    url = str(tmp_path / "s")
    store = CheckpointStore.init(url, compression="zstd", compression_level=7)
    assert msgpack.unpackb(store.backend.get(MARKER))["level"] == 7
    with pytest.raises(InvalidArgumentError, match="created with compression='zstd'"):
        CheckpointStore.open(url, compression="none")
    with pytest.raises(InvalidArgumentError, match="compression_level=7"):
        CheckpointStore.open(url, compression="zstd")
    for bad in ({"compression": "lz4"}, {"compression": "zstd", "compression_level": 99},
                {"compression": "zstd", "compression_level": True}):
        with pytest.raises(InvalidArgumentError):
            CheckpointStore.open(str(tmp_path / "x"), **bad)
    plain_opener = CheckpointStore.open(url)  # no settings given: it writes by the store's
    _grow(plain_opener, "t", 40)
    assert all(data[5] & ZSTD for data in _packs(plain_opener).values())
    # a store from before settings existed (packs and refs, no cas-store) takes the first
    # explicit ones, else the default; its plain packs stay readable beside compressed ones
    for first, zstd in ((None, True), ("none", False), ("zstd", True)):
        other = str(tmp_path / f"old-{first}")
        legacy = CheckpointStore.open(other, compression="none")
        _grow(legacy, "t", 30)
        legacy.backend.delete_many([MARKER])
        assert CheckpointStore.open(other).settings()["compression"] == "zstd"
        assert legacy.backend.get_many([MARKER])[MARKER] is None  # settings() wrote nothing
        mixed = CheckpointStore.open(other, compression=first)
        _grow(mixed, "u", 30)
        assert Settings.decode(legacy.backend.get(MARKER)).compression == (
            "zstd" if zstd else None)
        assert any(d[5] & ZSTD for d in _packs(mixed).values()) is zstd
        assert mixed.load("t").state["step"] == 29 and mixed.verify(deep=True).ok
    with pytest.raises(InvalidArgumentError):
        CheckpointStore.open(other, compression="none")


def test_new_stores_are_compressed_by_default(make_store: Any) -> None:
    """zstd unless a store is created with compression="none"; settings() writes nothing."""
    store = make_store()
    assert store.settings()["compression"] == "zstd"
    assert store.backend.get_many([MARKER])[MARKER] is None
    _grow(store, "t", 40)
    assert Settings.decode(store.backend.get(MARKER)) == Settings("zstd", 3)
    assert all(d[5] & ZSTD for d in _packs(store).values())
    plain = make_store(compression="none")
    _grow(plain, "t", 40)
    assert plain.settings()["compression"] is None
    assert not any(d[5] & ZSTD for d in _packs(plain).values())
    assert sum(map(len, _packs(plain).values())) > 2 * sum(map(len, _packs(store).values()))


def test_a_damaged_or_foreign_config_is_refused(tmp_path: Any) -> None:
    for body in (b"\xc1garbage", msgpack.packb({"cas_checkpoint": 3, "encryption": "aes"}),
                 msgpack.packb([1, 2]), b"\x00" * 5000):
        url = str(tmp_path / f"c{len(body)}-{body[:2].hex()}")
        store = CheckpointStore.open(url)
        store.backend.put_many({MARKER: body})
        with pytest.raises(FormatError, match="cas-store"):
            _grow(CheckpointStore.open(url), "t", 12)


def test_damaged_compressed_pack_is_an_integrity_error(tmp_path: Any) -> None:
    url = str(tmp_path / "d")
    store = CheckpointStore.open(url, compression="zstd")
    _grow(store, "t", 60)
    key, data = max(_packs(store).items(), key=lambda kv: len(kv[1]))
    assert data[5] & ZSTD
    flipped = bytearray(data)
    flipped[len(data) - 20] ^= 0x40
    store.backend.delete_many([key])
    store.backend.put_many({key: bytes(flipped)})
    with pytest.raises(IntegrityError):
        CheckpointStore.open(url).load("t", store.history("t")[-1].id)
    report = CheckpointStore.open(url).verify(deep=True)
    assert not report.ok and any(p.kind == "corrupt" for p in report.problems)


def _objects(n: int, size: int) -> dict[ObjectId, bytes]:
    out = {}
    for i in range(n):
        data = (f"{i:08d}" * (size // 8 + 1)).encode()[:size]
        out[object_id(data)] = data
    return out


def test_compressed_packs_read_back_and_skip_when_it_does_not_pay() -> None:
    objs = _objects(40, 2000)
    data = encode_pack(objs, Zstd(3))
    assert data[5] & ZSTD and len(data) < sum(map(len, objs.values())) // 3
    assert {k: bytes(v) for k, v in decode_pack(data).items()} == objs
    noise = {object_id(b): b for b in (os.urandom(3000), os.urandom(500))}
    assert not encode_pack(noise, Zstd(3))[5] & ZSTD  # random bytes: stored plain


def test_decompression_bombs_are_refused_before_allocating() -> None:
    import zstandard

    # an index that claims 200 MB of objects over a tiny body
    n, size = 200, 1 << 20
    head = encode_pack({}, None)[:5]
    index = struct.pack(">I", n) + b"\x00" * 4 * n + struct.pack(f">{n}I", *[size] * n)
    body = zstandard.ZstdCompressor().compress(b"\x00" * 1000)
    bomb = head + bytes([ZSTD]) + index + body
    with pytest.raises(FormatError, match="decompression bomb"):
        open_pack(bomb)
    with pytest.raises(FormatError):
        parse_pack(object_id(bomb), bomb)
    # a frame that holds more than its index says (within the ratio): refused, bounded
    real = zstandard.ZstdCompressor().compress(b"a" * (SMALL_BODY // 2))
    lie = head + bytes([ZSTD]) + struct.pack(">I", 1) + b"\x00" * 4 + struct.pack(">I", 1000) + real
    with pytest.raises(FormatError, match="decompress"):
        open_pack(lie)
    # what the writer refuses to produce: a body expanding past the ratio is stored plain
    zeros = {object_id(b"\x00" * (4 << 20)): b"\x00" * (4 << 20)}
    assert not encode_pack(zeros, Zstd(3))[5] & ZSTD


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_hostile_compressed_packs_only_raise_cas_errors(data: st.DataObject) -> None:
    pack = encode_pack(_objects(12, 700), Zstd(3))
    raw = bytearray(pack)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        raw = raw[:data.draw(st.integers(0, len(raw)))]
    try:
        view, index = open_pack(bytes(raw))
        for locations in index.values():
            for start, end in locations:
                object_id(view[start:end])
    except CasError:
        pass


def test_one_compressor_in_many_threads() -> None:
    """zstd contexts are not thread-safe: a store's compressor is used by every thread that saves
    through it (LangGraph writes from a thread pool); each must get a context of its own."""
    from concurrent.futures import ThreadPoolExecutor

    z = Zstd(3)
    bodies = [(f"{i:06d} " * 5000).encode() for i in range(64)]

    def roundtrip(body: bytes) -> bool:
        objs = {object_id(body): body}
        view, index = open_pack(encode_pack(objs, z))
        (locations,) = index.values()
        return bytes(view[locations[0][0]:locations[0][1]]) == body

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(roundtrip, bodies * 4))


def test_store_objects_share_the_zstd_contexts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store objects of a process share one compressor per zstd level, so a store object
    opened per request (a new saver) makes no zstd context of its own for its first pack
    (~0.2 ms to make and warm one; 341e6b3 made one for each store object)."""
    import uuid

    import zstandard

    made = 0
    real = zstandard.ZstdCompressor

    def counted(*args: Any, **kw: Any) -> Any:
        nonlocal made
        made += 1
        return real(*args, **kw)

    _grow(CheckpointStore.open(f"memory://shared-zstd-{uuid.uuid4().hex[:8]}"), "t", 12)
    monkeypatch.setattr(zstandard, "ZstdCompressor", counted)
    compressed = 0
    real_compress = Zstd.compress_parts

    def spy(self: Zstd, parts: Any, size: int) -> Any:
        nonlocal compressed
        compressed += 1
        return real_compress(self, parts, size)

    monkeypatch.setattr(Zstd, "compress_parts", spy)
    for _ in range(3):  # (each a new store object, as a saver made per request)
        _grow(CheckpointStore.open(f"memory://shared-zstd-{uuid.uuid4().hex[:8]}"), "t", 12)
    assert compressed >= 3, "no pack was compressed: the test needs bigger states"
    assert made == 0


def test_damaged_frame_headers_never_reach_an_allocation() -> None:
    """Regression: flipped bytes in a zstd frame header made zstandard raise MemoryError (it sized
    its output by the header). Bodies are now streamed, bounded by the index: 2,000 seeded
    damages of a real frame (three of the first 1,100 used to fail) raise FormatError only."""
    import random

    pack = encode_pack(_objects(12, 700), Zstd(3))
    body = 10 + 12 * 6
    rng = random.Random(1)
    for _ in range(2000):
        raw = bytearray(pack)
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(body, len(raw))] = rng.randrange(256)
        try:
            open_pack(bytes(raw))
        except FormatError:
            pass


def test_a_big_incompressible_body_is_tried_on_a_sample_only() -> None:
    """A body over 1 MB is tried on three 64 KB pieces first: random bytes are stored plain
    without compressing the whole body (no second copy of a big value); text still shrinks."""
    import random

    import zstandard

    z = Zstd(3)
    seen: list[int] = []

    class Counting:  # wraps this thread's context (a C type: not subclassed)
        def __init__(self) -> None:
            self.ctx = zstandard.ZstdCompressor(level=3, write_content_size=True)

        def compress(self, data: Any) -> bytes:
            seen.append(len(data))
            out: bytes = self.ctx.compress(data)
            return out

    z._mine.ctx = Counting()
    assert z.compress(random.Random(1).randbytes(4 << 20)) is None
    assert seen == [3 << 16]  # the sample, never the 4 MB body
    rng = random.Random(2)
    words = [bytes(rng.choices(b"abcdefghijklmnop", k=rng.randint(2, 9))) for _ in range(5000)]
    text = b" ".join(rng.choices(words, k=600_000))
    out = z.compress(text)
    assert out is not None and len(out) * 2 < len(text)


def test_a_big_new_pack_is_compressed_fast_and_merges_at_the_stores_level(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save whose new objects pass 64 KB (a whole state's first save) compresses its pack at
    zstd level 1; small flushes and every merge use the store's level; all of it loads."""
    levels: list[int] = []
    real = Zstd.compress_parts

    def spy(self: Zstd, parts: Any, size: int) -> list[bytes] | None:
        levels.append(self.level)
        return real(self, parts, size)

    monkeypatch.setattr(Zstd, "compress_parts", spy)
    store = CheckpointStore.open(str(tmp_path / "s"), compression="zstd", compression_level=7)
    big = {"messages": [_msg(i) for i in range(400)]}  # ~170 KB of new objects
    store.save("t", big)
    assert levels == [1]
    [first] = store.refs.read("t").head.packs
    levels.clear()
    small = _grow(store, "u", 40)  # 4 KB flushes, then merges of them
    assert levels and set(levels) == {7}
    levels.clear()
    store.refs.inline_max = 1  # every save a pack: thread t's big pack is merged soon
    for i in range(8):
        big["messages"].append(_msg(1000 + i))
        store.save("t", big)
    assert 7 in levels and set(levels) <= {1, 7}
    assert first.id not in {p.id for p in store.refs.read("t").head.packs}  # merged: level 7
    fresh = CheckpointStore.open(str(tmp_path / "s"))
    assert fresh.load("t").state == big and fresh.load("u").state == small
    assert Zstd(2).fast().level == 1 and Zstd(1).fast().level == 1


def test_a_cold_load_makes_one_decompression_context_a_thread(tmp_path: Any,
                                                             monkeypatch: Any) -> None:
    """Making a zstd decompression context costs about what decompressing a small pack does:
    each thread makes one and keeps it, not one a pack. Damaged frames still raise and do not
    spoil the next read (the context is made again)."""
    import threading

    import zstandard

    store = CheckpointStore.open(str(tmp_path / "s"))
    for t in range(3):
        _grow(store, f"t{t}", 20)
    made: list[int] = []
    real = zstandard.ZstdDecompressor

    def counted(*a: Any, **k: Any) -> Any:
        made.append(threading.get_ident())
        return real(*a, **k)

    monkeypatch.setattr(zstandard, "ZstdDecompressor", counted)

    def cold_loads() -> int:
        cold = CheckpointStore.open(str(tmp_path / "s"))
        for t in range(3):
            assert cold.load(f"t{t}").state["step"] == 19
        return cold._core.objects.misses

    packs_read = cold_loads()
    assert packs_read >= 6
    worker = threading.Thread(target=cold_loads)
    worker.start()
    worker.join()
    assert len(made) <= 2 and len(set(made)) == len(made)  # (0 here if a test before made it)
    pid, data = next((k, v) for k, v in _packs(store).items() if v[5] & ZSTD)
    with pytest.raises(FormatError, match="decompress"):
        open_pack(data[:-8])
    open_pack(data)  # the next read after a damaged one


def test_a_level_alone_asks_for_zstd_at_that_level(tmp_path: Any) -> None:
    """``compression_level`` without ``compression`` is the default compression (zstd) at that
    level, checked like any level (old code: a plain store, the level dropped without a word,
    and 99 accepted); with ``compression='none'`` a level is refused."""
    store = CheckpointStore.init(str(tmp_path / "a"), compression_level=7)
    assert store.settings()["compression"] == "zstd"
    assert store.settings()["compression_level"] == 7
    assert CheckpointStore.open(str(tmp_path / "a"), compression_level=7).settings() == (
        store.settings())
    with pytest.raises(InvalidArgumentError, match="from 1 to 19"):
        CheckpointStore.init(str(tmp_path / "b"), compression_level=99)
    with pytest.raises(InvalidArgumentError, match="compression='none' has no level"):
        CheckpointStore.init(str(tmp_path / "c"), compression="none", compression_level=3)
