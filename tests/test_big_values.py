"""Big str/bytes values (issue 11): the save and load fast paths (a value cut from the state's
encoding, stepped over by its header, joined once on load) give the same objects and the same
values as the plain paths, in every kind of store, and keep the memory a save needs bounded."""

from __future__ import annotations

import random
import tracemalloc
from typing import Any

import pytest

from cas_checkpoint import CheckpointStore, Key
from cas_checkpoint.format import codec
from cas_checkpoint.format.objects import encode_node, object_id
from cas_checkpoint.tree import build as tree
from cas_checkpoint.tree import cuts as scan
from cas_checkpoint.tree import load as join_module

MB = 1 << 20


def _text(rng: random.Random, n: int, alphabet: str = "") -> str:
    if alphabet:
        return "".join(rng.choice(alphabet) for _ in range(n))
    return rng.randbytes(n // 2).hex()


def _states() -> dict[str, Any]:
    rng = random.Random(11)
    return {
        "ascii str": {"v": _text(rng, 2 * MB)},
        "bytes": {"v": rng.randbytes(2 * MB)},
        "non-ascii str": {"v": _text(rng, 200_000, "aé€𝄞 xyz")},
        "a str alone": _text(rng, MB + 5),
        "bytes alone": rng.randbytes(MB + 5),
        "nested": {"docs": [_text(rng, 100_000) for _ in range(12)] + [rng.randbytes(70_000), 3],
                   "deep": {"a": [rng.randbytes(300_000), {"b": _text(rng, 90_000, "ñö😀ab")}]},
                   "t": (_text(rng, 50_000), rng.randbytes(40_000)), "n": None},
    }


@pytest.mark.parametrize("name", list(_states()))
def test_leaves_are_the_plain_encoding_of_each_piece(name: str) -> None:
    """Objects keep their names: every text leaf is ``encode_node`` of the codec bytes of its
    piece, as the plain path (``str.encode`` + ``codec.encode`` per piece) writes it."""
    value = _states()[name]
    built = tree.build(value)
    # (each of these is split: an item over BIG_ITEM bytes, a dict value, or the state)
    texts = [v for v in _walk(value) if type(v) in (str, bytes) and len(v) > tree.BIG_ITEM]
    assert texts
    for text in texts:
        raw = text.encode() if isinstance(text, str) else text
        start = 0
        for cut in tree.text_cuts(raw, isinstance(text, str)):
            piece = raw[start:cut]
            leaf = encode_node(bytes([tree.VALUE]) + codec.encode(
                piece.decode() if isinstance(text, str) else piece))
            assert built.objects.get(object_id(leaf)) == leaf
            start = cut
    assert all(object_id(d) == oid for oid, d in built.objects.items())


@pytest.mark.parametrize("name", list(_states()))
def test_stepping_over_big_items_builds_the_same_tree(name: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    value = _states()[name]
    fast = tree.build(value)
    monkeypatch.setattr(scan, "JUMP_MIN", 1 << 40)  # the Unpacker skips every item itself
    plain = tree.build(value)
    monkeypatch.setattr(scan, "JUMP_MIN", 1)
    monkeypatch.setattr(scan, "SCAN_DIRECT", 1)  # every walk reads along, and jumps
    jumpy = tree.build(value)
    assert fast.root == plain.root == jumpy.root
    assert fast.objects == plain.objects == jumpy.objects


@pytest.mark.parametrize("name", list(_states()))
def test_joining_text_once_gives_what_the_slow_path_gives(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    value = _states()[name]
    built = tree.build(value)
    fast = tree.load(built.root, lambda ids: {i: memoryview(built.objects[i]) for i in ids})
    monkeypatch.setattr(join_module._Joiner, "flat_text",
                        lambda *_: join_module._PENDING)
    slow = tree.load(built.root, lambda ids: {i: built.objects[i] for i in ids})
    assert fast == slow == value
    assert type(fast) is type(value)


@pytest.fixture(params=["memory", "local", "zstd", "encrypted"])
def url_opts(request: pytest.FixtureRequest, tmp_path: Any) -> tuple[str, dict[str, Any]]:
    kind = request.param
    if kind == "memory":
        return f"memory://big-{random.getrandbits(64):x}", {}
    opts: dict[str, Any] = ({"compression": "zstd"} if kind == "zstd" else
                            {"encryption": Key.generate()} if kind == "encrypted" else {})
    return str(tmp_path / kind), opts


def test_big_values_round_trip_in_every_kind_of_store(url_opts: tuple[str, dict[str, Any]]
                                                      ) -> None:
    url, opts = url_opts
    store = CheckpointStore.open(url, **opts)
    states = _states()
    for name, state in states.items():
        store.save(name, state)
    again = CheckpointStore.open(url, **opts)  # a new store object: read from storage
    for name, state in states.items():
        back = again.load(name).state
        assert back == state, name
        assert type(back) is type(state)
    assert again.verify().ok


def test_a_big_save_holds_few_copies_of_the_value() -> None:
    """A 12 MB bytes value saved into memory:// allocates (traced peak, beyond the value)
    under 3.6 times its size (3.1x here, 4.1x before the value was cut from the state's
    encoding instead of copied for it, and skipped by its header instead of gathered whole).
    Most of it is msgpack's own buffer, which grows to up to twice the encoding."""
    value = random.Random(3).randbytes(12 * MB)
    store = CheckpointStore.open(f"memory://big-peak-{random.getrandbits(64):x}")
    store.save("warm", {"x": 1})
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        store.save("t", {"v": value})
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept - base >= len(value)  # the stored pack (and the pack cache's view of it)
    assert peak - base < 3.6 * len(value), (peak - base) / len(value)


def _walk(value: Any) -> list[Any]:
    out, stack = [], [value]
    while stack:
        v = stack.pop()
        out.append(v)
        if type(v) in (list, tuple):
            stack.extend(v)
        elif type(v) is dict:
            stack.extend(v.values())
    return out


@pytest.mark.parametrize("opts", [{}, {"compression": "none"}, {"encryption": Key.generate()}],
                         ids=["zstd", "plain", "encrypted"])
def test_a_save_caches_its_pack_without_undoing_it(opts: dict[str, Any], tmp_path: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The pack a save writes is cached as it was made (no decompressing or decrypting of
    what was just compressed or sealed), and reads back the same from storage."""
    from cas_checkpoint.format import pack, sealing

    calls: list[str] = []
    real_decompress, real_open = pack._decompress, sealing.open_sealed_pack

    def decompress(*a: Any) -> None:
        calls.append("decompress")
        real_decompress(*a)

    def open_sealed(*a: Any) -> bytes:
        calls.append("decrypt")
        return real_open(*a)

    monkeypatch.setattr(pack, "_decompress", decompress)
    monkeypatch.setattr(sealing, "open_sealed_pack", open_sealed)
    rng = random.Random(5)
    state = {"v": _text(rng, 3 * MB), "b": rng.randbytes(MB), "w": ["word " * 400] * 30}
    store = CheckpointStore.open(str(tmp_path / "s"), **opts)
    store.save("warm", {"x": 1})
    calls.clear()
    store.save("t", state)
    assert store.load("t").state == state
    assert calls == []
    again = CheckpointStore.open(str(tmp_path / "s"), **opts)
    assert again.load("t").state == state  # from storage: the stored pack opens
    assert calls == (["decompress"] if not opts else [] if opts.get("compression") else
                     ["decrypt", "decompress"])


def test_a_body_compressed_from_its_parts_is_one_frame_of_them() -> None:
    """Compressing a pack body from its objects (never joined first) gives one frame that
    decompresses to the objects joined."""
    import zstandard

    from cas_checkpoint.format import pack

    rng = random.Random(8)
    for total, pieces in ((700_000, 90), (9 * MB, 1100)):
        text = _text(rng, total).encode()
        cuts = sorted(rng.sample(range(1, total), pieces - 1))
        parts = [text[a:b] for a, b in zip([0, *cuts], [*cuts, total], strict=True)]
        out = pack.Zstd(3).compress_parts(parts, total)
        assert out is not None
        frame = b"".join(out)
        assert zstandard.frame_content_size(frame) == total
        assert zstandard.ZstdDecompressor().decompress(frame) == text
        assert pack.Zstd(3).compress_parts([rng.randbytes(total)], total) is None


def test_a_big_state_is_not_held_with_msgpacks_spare_buffer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past REENCODE_MIN a state is encoded again into a buffer of its size (the same bytes,
    so the same tree): building it peaks near twice its encoding, not near three times."""
    rng = random.Random(9)
    state = {"docs": [_text(rng, 100_000) for _ in range(66)]}  # 6.6 MB: msgpack's buffer ~1.9x
    size = len(codec.encode(state))
    before = tree.build(state)

    def peak_of_build() -> float:
        tracemalloc.start()
        try:
            built = tree.build(state)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert built.root == before.root and built.objects == before.objects
        return peak / size

    monkeypatch.setattr(tree, "REENCODE_MIN", 1 << 40)
    grown = peak_of_build()
    monkeypatch.setattr(tree, "REENCODE_MIN", 1 << 20)
    exact = peak_of_build()
    assert exact < 2.3 < 2.6 < grown, (exact, grown)
