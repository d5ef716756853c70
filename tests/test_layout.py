"""Storage layout v3: objects inline in the head while few, then in packs merged geometrically;
caches; old stores refused by version."""

from __future__ import annotations

import functools
import os
import time
from typing import Any

import pytest
from builders import options, random_msg
from hypothesis import given, settings
from hypothesis import strategies as hs

from cas_checkpoint import CheckpointStore, FormatError
from cas_checkpoint.engine import staging
from cas_checkpoint.engine.refs import thread_key
from cas_checkpoint.format.heads import Head, PackRef
from cas_checkpoint.format.objects import ObjectId, object_id
from cas_checkpoint.format.pack import decode_pack, encode_pack

# --- packing.stage, pure ----------------------------------------------------------------------


def _objs(n: int, size: int, seed: int) -> dict[ObjectId, bytes]:
    out = {}
    for i in range(n):
        data = b"CASN\x03\x00" + bytes([seed % 256, i % 256]) * (size // 2)
        out[object_id(data)] = data
    return out


def test_stage_keeps_few_objects_inline_then_flushes_one_pack() -> None:
    head = Head("t", None)
    small = _objs(3, 100, 1)
    staged, packs = staging.stage(head, small, lambda ids: {}, inline_max=1000)
    assert packs == {} and len(staged.inline) == 3 and staged.packs == ()
    more = _objs(10, 100, 2)
    staged, packs = staging.stage(staged, more, lambda ids: {}, inline_max=1000)
    assert staged.inline == () and len(staged.packs) == 1 and list(packs) == [staged.packs[0].id]
    inside = decode_pack(packs[staged.packs[0].id])
    assert set(inside) == set(small) | set(more)  # every object went into the pack
    assert all(object_id(bytes(v)) == k for k, v in inside.items())


def test_stage_merges_four_packs_of_a_level_and_caps_the_count() -> None:
    store: dict[ObjectId, bytes] = {}

    def read(ids: list[ObjectId]) -> dict[ObjectId, dict[ObjectId, memoryview]]:
        return {i: decode_pack(store[i]) for i in ids}

    head = Head("t", None)
    every: set[str] = set()
    for n in range(200):
        new = _objs(4, 300, n)
        every |= set(new)
        head, packs = staging.stage(head, new, read, inline_max=1000)
        store.update(packs)
        assert len(head.packs) <= staging.MAX_PACKS
        levels = [p.level for p in head.packs]
        # no run of MERGE_FACTOR packs of one level is left at the end
        assert not (len(levels) >= 4 and len(set(levels[-4:])) == 1)
    held = set(object_id(d) for d in head.inline)
    for p in head.packs:
        held |= set(decode_pack(store[p.id]))
    assert held == every  # merges never drop an object
    assert max(p.level for p in head.packs) >= 2


def test_stage_reads_a_pack_only_when_it_merges_it() -> None:
    asked: list[list[ObjectId]] = []
    data = encode_pack(_objs(2, 50, 9))
    old = PackRef(object_id(data), 0, len(data), 2)
    head = Head("t", None, packs=(old, old, old))  # three level-0 packs, then one more flush

    def read(ids: list[ObjectId]) -> dict[ObjectId, dict[ObjectId, memoryview]]:
        asked.append(ids)
        return {i: decode_pack(data) for i in ids}

    staging.stage(head, _objs(2, 50, 1), read, inline_max=10_000)
    assert asked == []  # stays inline: nothing read
    staged, packs = staging.stage(head, _objs(30, 500, 2), read, inline_max=1000)
    assert asked == [[old.id, old.id, old.id]] or sorted(asked[0]) == [old.id] * 3
    assert len(staged.packs) == 1 and staged.packs[0].level == 1 and len(packs) == 1


# --- through the store ---------------------------------------------------------------------------


def test_steady_saves_write_the_ref_and_now_and_then_one_pack(store: CheckpointStore,
                                                              monkeypatch: Any) -> None:
    state: dict[str, Any] = {"messages": [random_msg(i) for i in range(50)]}
    store.save("t", state)
    writes: list[list[str]] = []
    real = store.backend.put_many

    def put(items: dict[str, bytes]) -> None:
        writes.append(sorted(items))
        real(items)

    monkeypatch.setattr(store.backend, "put_many", put)
    n = 60 if not store.url.startswith("s3") else 25
    for i in range(n):
        state["messages"].append(random_msg(100 + i))
        store.save("t", state)
    assert all(len(w) <= 1 for w in writes)  # at most one pack a save (merges included)
    # a save adds ~600 bytes (a message, its record, index nodes): a pack every few saves
    assert 0 < len(writes) <= n // 4, (len(writes), n)
    fresh = CheckpointStore.open(store.url, storage_options=options(store))
    assert fresh.load("t").state == state


def test_many_saves_keep_the_pack_count_bounded(tmp_path: Any) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.refs.inline_max = 600  # flush nearly every save: many packs, many merges
    state: dict[str, Any] = {"messages": []}
    ids = []
    for i in range(400):
        state["messages"].append(random_msg(i))
        ids.append(store.save("t", state).id)
    ref = store.refs.read("t")
    assert ref is not None and 1 < len(ref.head.packs) <= staging.MAX_PACKS
    fresh = CheckpointStore.open(str(tmp_path / "s"))
    for k in (0, 1, 199, 398, 399):  # old checkpoints stay loadable through every merge
        assert fresh.load("t", ids[k]).state == {"messages": state["messages"][:k + 1]}


def test_cache_dir_serves_packs_to_a_new_store(store: CheckpointStore, tmp_path: Any,
                                               monkeypatch: Any) -> None:
    state: dict[str, Any] = {"messages": [random_msg(i) for i in range(120)]}
    store.save("t", state)
    opts = options(store)
    cache = tmp_path / "cache"
    first = CheckpointStore.open(store.url, storage_options=opts, cache_dir=cache)
    assert first.load("t").state == state
    assert first.stats().cache_misses >= 1
    second = CheckpointStore.open(store.url, storage_options=opts, cache_dir=cache)
    asked: list[str] = []
    real = second.backend.get_many

    def get_many(keys: Any) -> Any:
        keys = list(keys)
        asked.extend(keys)
        return real(keys)

    monkeypatch.setattr(second.backend, "get_many", get_many)
    assert second.load("t").state == state
    assert [k for k in asked if k.startswith("packs/")] == []  # every pack from the cache dir
    assert second.stats().cache_misses == 0 and second.stats().cache_hits >= 1
    # a damaged cache file is re-hashed, found wrong, and read from storage instead
    for name in os.listdir(cache):
        with open(cache / name, "r+b") as f:
            f.seek(40)
            byte = f.read(1)
            f.seek(40)
            f.write(bytes([byte[0] ^ 1]))
    third = CheckpointStore.open(store.url, storage_options=opts, cache_dir=cache)
    assert third.load("t").state == state and third.stats().cache_misses >= 1


def test_a_store_of_format_2_is_refused_naming_its_version(store: CheckpointStore) -> None:
    store.save("t", {"a": 1})
    key = thread_key("t")
    got = store.backend.read_ref(key)
    assert got is not None
    old = got[0][:4] + b"\x02" + got[0][5:]  # what cas_checkpoint 0.1 (format 2) wrote
    store.backend.write_ref(key, old, got[1])
    fresh = CheckpointStore.open(store.url, storage_options=options(store))
    with pytest.raises(FormatError, match="format version 2.*older cas_checkpoint"):
        fresh.load("t")


def test_thread_ids_of_any_length_have_bounded_keys(store: CheckpointStore) -> None:
    long_id = "|".join(f"node{i}:task-{i:04d}-ü" for i in range(300))  # > 4 KB of UTF-8
    assert len(long_id.encode()) > 4096
    key = thread_key(long_id)
    assert key.startswith("refs/heads/h-") and len(key) < 100
    store.save(long_id, {"a": 1})
    store.save("short", {"b": 2})
    assert store.threads() == sorted([long_id, "short"])
    fresh = CheckpointStore.open(store.url, storage_options=options(store))
    assert fresh.load(long_id).state == {"a": 1}


def test_repack_frees_what_prune_dropped_and_keeps_every_checkpoint(
        store: CheckpointStore) -> None:
    from datetime import timedelta

    store.refs.inline_max = 2000
    state: dict[str, Any] = {"messages": []}
    for i in range(80):
        state["messages"] = [random_msg(i * 1000 + j) for j in range(5)]  # nothing shared
        store.save("t", state, label="keep" if i == 3 else None)
    store.fork("t", store.history("t")[40].id, "f")  # the fork keeps naming the old packs
    store.prune("t", keep_last=5)
    kept = {c.id: store.load("t", c.id).state for c in store.history("t")}
    assert len(kept) == 6  # the last 5 and the labelled one
    ref = store.refs.read("t")
    assert ref is not None
    lineage = ref.head.lineage
    dry = store.repack(dry_run=True)
    assert not any(t.repacked for t in dry.threads) and store.refs.read("t") == ref
    report = store.repack("t")
    (only,) = report.threads
    assert only.repacked and only.bytes_after < only.bytes_before / 5
    ref = store.refs.read("t")
    assert ref is not None and len(ref.head.packs) == 1 and ref.head.lineage != lineage
    fresh = CheckpointStore.open(store.url, storage_options=options(store))
    for cid, st in kept.items():
        assert fresh.load("t", cid).state == st
    before = fresh.storage_bytes()
    if store.url.startswith("s3://"):  # S3's LastModified counts whole seconds: a pack the
        time.sleep(1.1)  # repack just replaced is not yet older than a grace of 0 (a fast CI run)
    fresh.gc(grace=timedelta(0), force=True)
    assert fresh.storage_bytes() < before
    assert fresh.load("f").state["messages"][0]["id"] == 39_000  # the fork is intact
    # a store that saw the old lineage still writes every node its next save needs
    state["messages"].append(random_msg(999_999))
    store.save("t", state)
    assert CheckpointStore.open(store.url, storage_options=options(store)).load(
        "t").state == state
    assert store.repack("t").threads[0].repacked is False  # nothing left to free


@functools.cache
def _prefix_collision() -> tuple[tuple[str, bytes], tuple[str, bytes]]:
    """Two node objects whose ids share their first 4 bytes (a birthday: ~80,000 ids)."""
    seen: dict[str, tuple[str, bytes]] = {}
    for i in range(2_000_000):
        data = b"CASN\x03\x00\x00" + str(i).encode()
        oid = object_id(data)
        if oid[:8] in seen:
            return seen[oid[:8]], (oid, data)
        seen[oid[:8]] = (oid, data)
    pytest.fail("no 32-bit prefix collision in 2 million ids")


def test_a_chance_prefix_collision_between_packs_is_not_an_error(tmp_path: Any) -> None:
    """Pack indexes name objects by a 4-byte id prefix: an object found in one pack must not be
    hidden by another pack holding a different object of the same prefix; a pack that names
    an object by its prefix with other bytes (and nothing else has it) is an IntegrityError."""
    from cas_checkpoint.engine.object_store import View, parse_pack
    from cas_checkpoint.errors import IntegrityError

    (a, da), (b, db) = _prefix_collision()
    pa, pb = encode_pack({ObjectId(a): da}), encode_pack({ObjectId(b): db})
    packs = [parse_pack(object_id(pa), pa), parse_pack(object_id(pb), pb)]
    head = Head("t", None)
    view = View(head, packs, None)  # type: ignore[arg-type]
    assert view.get(b) == db and view.get(a) == da  # each found past the other's pack
    lone = View(head, packs[:1], None)  # type: ignore[arg-type]
    with pytest.raises(IntegrityError):
        lone.get(b)  # named by prefix, with other bytes, and nowhere else


def test_only_hex_hashed_keys_name_long_threads() -> None:
    from cas_checkpoint.engine.refs import is_hashed_key, is_thread_key

    good = thread_key("x" * 200)
    assert is_hashed_key(good) and is_thread_key(good)
    bad = good[:-1] + "z"  # base32 cannot spell "h-": no thread's key at all
    assert not is_hashed_key(bad) and not is_thread_key(bad)


@given(hs.text(min_size=1, max_size=80) | hs.binary(min_size=1, max_size=120).map(
    lambda b: b.decode("latin-1")))
@settings(max_examples=300, deadline=None)
def test_a_short_thread_key_is_the_base32_of_its_id(thread_id: str) -> None:
    """Keys are stored names: the hand-made base32 spells every id as ``base64.b32encode``
    always did (lower case, no padding), and the key reads back as the id."""
    import base64

    from cas_checkpoint.engine.refs import SHORT_KEY_BYTES, thread_from_key

    raw = thread_id.encode("utf-8")  # (hypothesis's text has no lone surrogates)
    if len(raw) > SHORT_KEY_BYTES:
        return  # a hashed key (tested above)
    want = "refs/heads/" + base64.b32encode(raw).decode("ascii").rstrip("=").lower()
    assert thread_key(thread_id) == want
    assert thread_from_key(want) == thread_id


def test_a_prefix_collision_inside_one_pack_finds_both_objects() -> None:
    """Two objects of one pack whose ids share their 4-byte prefix: the index keeps both
    locations, each object is found by its own id; a pack whose index files more than
    ``MAX_SAME_PREFIX`` objects under one prefix is refused before anything is hashed."""
    from cas_checkpoint.engine.object_store import parse_pack
    from cas_checkpoint.errors import FormatError
    from cas_checkpoint.format.pack import MAX_SAME_PREFIX, PACK_PREFIX, open_pack, pack_prefix

    (a, da), (b, db) = _prefix_collision()
    others = {object_id(d): d for d in (b"CASN\x03\x00\x00x", b"CASN\x03\x00\x00y")}
    objs = {**others, ObjectId(a): da, ObjectId(b): db}
    data = encode_pack(objs)
    view, index = open_pack(data)
    assert len(index) == 3 and index.count == 4
    assert [bytes(view[s:e]) for s, e in index[pack_prefix(a)]] == [da, db]
    assert decode_pack(data) == objs
    pack = parse_pack(object_id(data), data)
    assert pack.get(a) == da and pack.get(b) == db and pack.objects == objs
    lie = bytearray(encode_pack({object_id(bytes([i])): bytes([i]) for i in range(40)}))
    lie[10:10 + 40 * PACK_PREFIX] = lie[10:10 + PACK_PREFIX] * 40  # one prefix for all 40
    with pytest.raises(FormatError, match="share an id prefix"):
        open_pack(bytes(lie))
    assert MAX_SAME_PREFIX < 40
