"""What a store object's caches hold stays bounded by what its threads in use need, however
long a thread grows (issue 29: peak memory of a long agent thread).

A thread that grows by a few messages a save, beside a new short thread each turn (LangGraph's
subgraph namespace, new every turn): the packs a merge replaced, the states of older saves,
and everything of the threads not used lately are let go of. What stays is the packs the
growing thread's head names (a load of its head reads them all) and a few states."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from cas_checkpoint import CheckpointStore
from cas_checkpoint.engine import caches, process_caches
from cas_checkpoint.engine import object_store as objstore
from cas_checkpoint.format import codec
from cas_checkpoint.format.objects import ObjectId
from cas_checkpoint.tree import build as tree


def _held(store: CheckpointStore) -> dict[str, int]:
    core: Any = store._core
    packs = core.objects._cache.values()
    current = core._known["main"].head.packs
    by_id = {p.id: p.held for p in packs}  # (what each holds now: none is decompressed)
    return {
        "packs": sum(by_id.values()),
        "head_packs": sum(by_id.get(p.id, 0) for p in current),  # what a load of it reads
        "states": sum(map(len, core._warm._states.values())),
        "known_ids": sum(len(k.ids) + len(getattr(k, "older", ())) for k in core._have.values()),
    }


def _turn(store: CheckpointStore, t: int, messages: list[dict[str, Any]]) -> None:
    for step in range(4):  # a few saves a turn, the state growing
        if step < 2:
            messages.append({"role": "ai" if step else "human", "turn": t,
                             "text": f"turn {t} step {step} " + "lorem ipsum " * 20})
        store.save("main", {"messages": messages, "step": step, "turn": t})
    store.save(f"ns-{t}", {"recalled": t, "seen": messages[-8:], "pad": "x" * 2000})


def test_caches_hold_what_the_threads_in_use_need_whatever_the_thread_length(
        tmp_path: Path) -> None:
    """After 60 and after 240 turns: besides the packs the growing thread's head names, the
    pack cache holds at most a bounded amount (the parts of merges and the packs of threads
    not used lately are let go of), the state encodings kept are a few states' worth, and the
    known ids are about the thread's state, not its history. (Before: the pack cache held every
    merge's parts and every turn's thread, 2.7 MB with 0.55 MB of current packs at 240 turns,
    growing to its 256 MB bound; the states every save's encoding: 4.3 MB at 60 turns, 65.6 MB
    at 240, to its 64 MB bound. Now 0.85 MB and 0.54 MB.)"""
    store = CheckpointStore.open(str(tmp_path / "s"))
    messages: list[dict[str, Any]] = []
    got = []
    for t in range(240):
        _turn(store, t, messages)
        if t + 1 in (60, 240):
            got.append(_held(store))
    state = len(__import__("cas_checkpoint.format.codec").format.codec.encode(
        {"messages": messages, "step": 3, "turn": 239}))
    for h in got:
        others = h["packs"] - h["head_packs"]
        assert others <= 64 * 20_000, (got, state)  # the 64 threads used last, small ones
        assert h["states"] <= 2 * state + 64 * 1024 + 64 * 10_000, (got, state)
    early, late = got
    assert late["packs"] - late["head_packs"] <= early["packs"] - early["head_packs"] + 64_000, got
    assert late["known_ids"] <= 2 * early["known_ids"] + 4096, got
    assert store.load("main").state["messages"] == messages


def test_a_long_threads_known_ids_roll_over_and_saves_still_write_only_what_is_new(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ids a store object knows a thread's lineage holds (so a save skips writing them)
    are its newest states' nodes and what it wrote lately, in two generations of at most
    ``KNOWN_IDS``: not every id the thread ever held. A save after many roll-overs still
    writes only its new nodes. (Before: every id the thread's saves wrote, 757 here.)"""
    monkeypatch.setattr(caches, "KNOWN_IDS", 40, raising=False)  # (none before)
    store = CheckpointStore.open(str(tmp_path / "s"))
    messages: list[dict[str, Any]] = []
    written: list[int] = []
    missing = caches.Known.missing

    def counting(self: caches.Known, nodes: dict[str, bytes]) -> dict[str, bytes]:
        got = missing(self, nodes)
        written.append(len(got))
        return got

    monkeypatch.setattr(caches.Known, "missing", counting)
    for i in range(300):
        messages.append({"i": i, "text": f"message {i} " + "lorem ipsum " * 12})
        store.save("t", {"messages": messages})
    known: Any = store._core._have["t"]
    nodes = len(tree.build({"messages": messages}).objects)
    assert len(known.ids) + len(getattr(known, "older", ())) <= 2 * (40 + nodes + 8), nodes
    assert max(written[-50:]) <= 8 < nodes, (written[-50:], nodes)  # a leaf, what is above,
    assert store.load("t").state["messages"] == messages  # the record, the log segment


def test_memory_stores_shared_caches_let_go_of_what_their_threads_no_longer_need() -> None:
    """The process-wide caches of a memory:// store (shared.py) follow the same rule: the packs
    a merge replaced and the states past a thread's newest are dropped there too, not kept
    until the process-wide bound (128 MB of packs, 64 MB of states) reaches them. (Before:
    1.4 MB of packs and 19.2 MB of states for this store after 120 turns; now 0.67 and 0.46.)"""
    store = CheckpointStore.open(f"memory://cache-bounds-{uuid.uuid4().hex}")
    scope = store._core.objects.shared.scope
    messages: list[dict[str, Any]] = []
    for t in range(120):
        _turn(store, t, messages)

    def held(lru: Any) -> int:
        return sum(size for key, (size, _) in list(lru.items.items()) if key[0] is scope)

    state = len(codec.encode({"messages": messages, "step": 3, "turn": 119}))
    current = sum(p.size for p in store._core._known["main"].head.packs)
    packs, states = held(process_caches.PACKS), held(process_caches.STATES)
    assert packs <= 12 * current + 64 * 8_000, (packs, current)
    assert states <= 3 * state + 64 * 20_000, (states, state)
    assert CheckpointStore.open(store.url).load("main").state["messages"] == messages


def test_the_pack_cache_keeps_the_packs_of_the_newest_heads_of_the_threads_used_last(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``PackCache.own``: a pack leaves the cache when no tracked thread's newest head names
    it any more (a merge replaced it; its thread fell out of the ``OWNED_THREADS`` used last);
    one that another tracked thread still names (a fork's) stays; one no thread was ever
    known to name (read by gc or verify) stays under the byte bound only."""
    from cas_checkpoint.engine import pack_cache
    from cas_checkpoint.engine.object_store import Pack
    from cas_checkpoint.format.heads import Head, PackRef
    from cas_checkpoint.format.pack import PackIndex

    monkeypatch.setattr(pack_cache, "OWNED_THREADS", 3)
    released: list[str] = []
    cache = pack_cache.PackCache(1 << 30, released.extend)

    def pack(pid: str) -> PackRef:
        cache.remember(Pack(ObjectId(pid), 100, memoryview(b"x" * 100), PackIndex()))
        return PackRef(ObjectId(pid), 0, 100, 1)

    def head(thread: str, *packs: PackRef) -> Head:
        return Head(thread, None, packs=packs)

    a, b, loose = pack("a" * 64), pack("b" * 64), pack("f" * 64)
    cache.own(head("t", a, b))
    cache.own(head("fork", a))
    merged = pack("d" * 64)
    cache.own(head("t", merged))  # a and b merged into d: b goes, a stays (the fork's)
    assert set(cache.packs) == {a.id, merged.id, loose.id} and released == [b.id]
    c = pack("c" * 64)
    cache.own(head("u", c))
    cache.own(head("v"))  # four threads: the least recently used ("fork") is let go of
    assert set(cache.packs) == {merged.id, c.id, loose.id}
    assert cache.bytes == 300


def test_threads_a_store_object_no_longer_uses_are_forgotten_after_1024() -> None:
    """An agent whose every turn makes a new namespace (a new thread) leaves one head a turn
    behind (its log's tail, the metadata of its entries: ~19 KB a thread in bench_agent_app):
    a store object remembers the heads of the 1,024 threads used last, not 4,096."""
    store = CheckpointStore.open(f"memory://threads-kept-{uuid.uuid4().hex}")
    for t in range(1100):
        store.save(f"ns-{t}", {"turn": t})
    core: Any = store._core
    assert len(core._known) <= 1024 and len(core._warm._newest) <= 1024
    assert "ns-1099" in core._known and "ns-0" not in core._known
    assert store.load("ns-0").state == {"turn": 0}  # (forgotten: read again)


def test_a_big_pack_a_merge_made_is_cached_as_stored_until_an_object_of_it_is_needed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compressed pack this store object made (a merge's: the thread's history, ~10x its
    stored bytes once decompressed) is kept as it was stored: a thread that goes on saving
    loads warm and reads nothing of it, so its plain bytes were only held (issue 29's peak
    memory: the current head's packs, decompressed). Its body is decompressed when an object
    of it is needed (a load of an older checkpoint) into a scratch buffer, and the objects the
    load takes are copied out: what it holds grows by those, not by its whole body. (Old
    code: the cache held every pack decompressed, 6x its stored bytes here.)"""
    # (the packs this makes depend on how the list is cut: the cut this test was written
    # with, one leaf a message until 64 of them, keeps them the same)
    monkeypatch.setattr(tree, "LONG_LIST", 64)
    store = CheckpointStore.open(str(tmp_path / "s"))
    messages: list[dict[str, Any]] = []
    ids = []
    for t in range(120):
        messages.append({"turn": t, "text": f"turn {t} " + "lorem ipsum dolor " * 30})
        ids.append(store.save("main", {"messages": messages, "turn": t}).id)
    core: Any = store._core
    cache = core.objects.cache
    packs = list(cache.packs.values())
    plain = {p.id: p.index.spans()[-1][1] for p in packs}
    big = [p for p in packs if plain[p.id] >= objstore.LAZY_BYTES]
    assert big and sum(plain.values()) > 4 * sum(p.size for p in packs)  # (compressible)
    assert all(p.held == p.size for p in big)
    assert cache.bytes < sum(plain.values()) / 2, (cache.bytes, plain)
    assert store.load("main", ids[5]).state["turn"] == 5  # (an old one: not warm)
    assert any(p.held > p.size for p in big)  # (objects taken out now)
    assert all(p.held < plain[p.id] for p in big)  # (not its whole body)
    assert store.load("main").state["turn"] == 119
    assert cache.bytes == sum(core.objects.cache._counted.values())
    cold = CheckpointStore.open(str(tmp_path / "s"))
    assert cold.load("main", ids[60]).state["messages"] == messages[:61]
