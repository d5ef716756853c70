"""A cold read decompresses a prefix of each pack body (issue 29, a never-read thread): a merge
writes first what the head's newest entries reach, in the order a read takes it
(``live.walk``), and ends a zstd block after it (``Zstd.compress_parts``); the reader
decompresses a body only as far as the objects it takes (``pack.scratch_body``). One zstd
frame as before: a store written before reads the same, and every object is hashed."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest

from cas_checkpoint import CheckpointStore
from cas_checkpoint.engine import live, process_caches, staging
from cas_checkpoint.engine.pack_reads import Pack, pack_key
from cas_checkpoint.errors import CasError
from cas_checkpoint.format import pack as packfile
from cas_checkpoint.format.objects import object_id
from tests._zstd_count import counting_zstd


class _Loop(TypedDict):
    messages: Annotated[list[str], operator.add]


def _words(seed: int, size: int = 300) -> str:
    import random

    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "tool", "query", "result", "answer", "the",
             "of", "search", "model", "state", "value", "graph", "node"]
    return " ".join(rng.choice(words) for _ in range(size // 4))[:size]


def _tool_loop(url: str, threads: int, steps: int) -> None:
    """``threads`` threads of a model/tool loop of ``steps`` steps (two ~300-byte messages a
    step), as bench_langgraph --many writes them."""
    from langgraph.graph import END, START, StateGraph

    from cas_checkpoint.integrations.langgraph import CasSaver

    def model(state: _Loop) -> dict[str, Any]:
        return {"messages": [f"ai {len(state['messages'])} " + _words(len(state["messages"]))]}

    def tool(state: _Loop) -> dict[str, Any]:
        return {"messages": [f"tool {len(state['messages'])} " + _words(-len(state["messages"]))]}

    def route(state: _Loop) -> str:
        return "tool" if len(state["messages"]) < 2 * steps else END

    g = StateGraph(_Loop)
    g.add_node("model", model)
    g.add_node("tool", tool)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, ["tool", END])
    g.add_edge("tool", "model")
    graph = g.compile(checkpointer=CasSaver.from_url(url))
    for k in range(threads):
        graph.invoke({"messages": ["human " + _words(-1)]},
                     {"configurable": {"thread_id": f"c{k}"}, "recursion_limit": 4 * steps})


def _cold_get_tuple(url: str, monkeypatch: pytest.MonkeyPatch
                    ) -> tuple[list[int], list[Pack], int]:
    """A never-read thread's get_tuple on a warm saver of a process that never read the
    store: (the bytes each zstd stream gave, the packs it opened, the objects it hashed)."""
    from cas_checkpoint.engine import pack_reads
    from cas_checkpoint.integrations.langgraph import CasSaver

    process_caches.clear()
    saver = CasSaver.from_url(url)
    saver.get_tuple({"configurable": {"thread_id": "c0", "checkpoint_ns": ""}})  # (warm)
    opened: list[Pack] = []
    real_parse, real_ids = pack_reads.parse_pack, pack_reads.object_ids
    hashed: list[int] = []

    def parse(*a: Any, **k: Any) -> Pack:
        opened.append(real_parse(*a, **k))
        return opened[-1]

    def ids(views: Any) -> Any:
        hashed.append(len(views))
        return real_ids(views)

    from cas_checkpoint.engine import object_store

    monkeypatch.setattr(object_store, "parse_pack", parse)
    monkeypatch.setattr(pack_reads, "parse_pack", parse)
    monkeypatch.setattr(pack_reads, "object_ids", ids)
    counts = counting_zstd(monkeypatch)
    got = saver.get_tuple({"configurable": {"thread_id": "c1", "checkpoint_ns": ""}})
    assert got is not None and len(got.checkpoint["channel_values"]["messages"]) > 0
    return counts, opened, sum(hashed)


def test_a_never_read_thread_decompresses_what_its_newest_state_takes(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench_langgraph --many's read at 40 steps: each pack the cold get_tuple opens is one
    zstd stream, read as far as the objects it takes: less than 40% of the bodies (measured
    ~30%; the newest state's objects sit first, the history after). Old code: every body
    whole (100%). Objects hashed: those taken, no more."""
    pytest.importorskip("langgraph")
    url = str(tmp_path / "s")
    _tool_loop(url, 2, 40)
    counts, opened, hashed = _cold_get_tuple(url, monkeypatch)
    bodies = sum(p.index.size - p.index.spans()[0][0] for p in opened)  # (plain bytes)
    taken = [p for p in opened if p.taken]
    assert taken and len(opened) <= 4  # (the newest packs only: live.newest)
    assert len(counts) <= len(opened)  # (one stream a pack at most)
    assert 0 < sum(counts) < 0.4 * bodies, (counts, bodies)
    assert hashed == sum(len(p.taken or ()) for p in opened) + sum(
        len(p.verified) for p in opened if not p.taken and p._data is not None)


def test_a_pack_written_in_one_block_and_in_any_order_reads_the_same(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store written as before this change (a merge's objects in the order saved, each body
    one zstd block as zstd cuts it: no FIRST walk, no block ends) reads the same state cold:
    the reader asks a stream for what it needs and gets it, whatever the blocks."""
    pytest.importorskip("langgraph")
    from cas_checkpoint.integrations.langgraph import CasSaver

    url = str(tmp_path / "s")
    monkeypatch.setattr(staging, "FIRST", 0)
    monkeypatch.setattr(packfile, "BLOCK", 1 << 30)
    _tool_loop(url, 2, 40)
    monkeypatch.undo()
    want = CasSaver.from_url(url).get_tuple({"configurable": {"thread_id": "c1"}})
    counts, opened, _ = _cold_get_tuple(url, monkeypatch)
    bodies = sum(p.index.size - p.index.spans()[0][0] for p in opened if p.taken)
    assert opened and sum(counts) > 0.9 * bodies  # (laid out as before: read ~whole)
    process_caches.clear()
    got = CasSaver.from_url(url).get_tuple({"configurable": {"thread_id": "c1"}})
    assert want is not None and got is not None and got.checkpoint == want.checkpoint


def _blocks(frame: bytes) -> list[tuple[int, int]]:
    """(start, end) of each block of a zstd frame (RFC 8878: header, then 3-byte block
    headers)."""
    fhd = frame[4]
    single, fcs, did = (fhd >> 5) & 1, fhd >> 6, fhd & 3
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[did] + ((1 if single else 0), 2, 4, 8)[fcs]
    out = []
    while at < len(frame):
        head = int.from_bytes(frame[at:at + 3], "little")
        size = 1 if (head >> 1) & 3 == 1 else head >> 3
        out.append((at + 3, at + 3 + size))
        at += 3 + size
        if head & 1:
            break
    return out


def test_damage_past_the_newest_state_leaves_its_read_and_verify_finds_it(
        tmp_path: Any) -> None:
    """A pack that hashes to its name whose zstd frame is damaged past the blocks of the
    newest state: a cold load of the newest state reads (what it takes is hashed), a load of
    an old checkpoint whose objects lie past it gets a CasError naming the pack, and verify
    reports the pack."""
    from tests._hostile import plant_lying_pack

    store = CheckpointStore.open(str(tmp_path / "s"))
    for i in range(40):
        store.save("t", {"i": i, "log": [_words(7 * i + k, 200) for k in range(12)]})
    ref = store.refs.read("t")
    assert ref is not None
    view = store.objects.view(ref.head)
    objects = {oid: view.get(oid) for oid in view.ids()}
    newest = [o for o in live.walk(ref.head, objects.get, 1) if o in objects]
    ordered = {o: objects[o] for o in newest} | objects
    real = staging.make_pack

    def first_in_own_blocks(objs: Any, level: int, *a: Any) -> Any:
        ref_, data, _ = staging.make_packs(ordered, level, packfile.Zstd(3), None,
                                           len(newest))
        frame = data[data.index(b"\x28\xb5\x2f\xfd"):]
        start, end = _blocks(frame)[-2]  # (the last block holding data: history)
        bad = bytearray(data)
        bad[len(data) - len(frame) + (start + end) // 2] ^= 0xFF
        return staging.PackRef(object_id(bytes(bad)), level, len(bad), len(objs)), bytes(bad)

    staging.make_pack = first_in_own_blocks
    try:
        pref = plant_lying_pack(store, "t", ref, objects, newest[0], objects[newest[0]])
    finally:
        staging.make_pack = real
    assert packfile.SCRATCH_MIN <= sum(map(len, objects.values())) <= packfile.SCRATCH_MAX
    process_caches.clear()
    fresh = CheckpointStore.open(store.url)
    assert fresh.load("t").state["i"] == 39
    process_caches.clear()
    fresh = CheckpointStore.open(store.url)
    with pytest.raises(CasError) as err:
        fresh.load("t", fresh.history("t")[-1].id)  # (the first save: history, past it)
    assert pack_key(pref.id) in str(err.value)
    process_caches.clear()
    report = CheckpointStore.open(store.url).verify(deep=True)
    assert not report.ok and any(pack_key(pref.id) in p.path for p in report.problems)
