"""A cold read of a long thread's newest state (issue 29, "latest-state read <= SqliteSaver's"):
it decompresses what the newest state needs, not the history merged with it, and through the
LangGraph saver it is the ref, then the packs: two rounds, whatever the thread's length."""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import pytest

from cas_checkpoint import CheckpointStore
from cas_checkpoint.engine import staging
from cas_checkpoint.format import pack as packfile
from cas_checkpoint.format.heads import Head, PackRef
from cas_checkpoint.format.objects import CheckpointId, ObjectId, Record, encode_node, object_id
from cas_checkpoint.format.pack import decode_pack


@pytest.fixture
def decompressed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The plain bytes of each pack body decompressed from here on."""
    seen: list[int] = []
    real = packfile._decompress

    def counting(data: memoryview, start: int, size: int, out: bytearray) -> None:
        seen.append(size)
        real(data, start, size, out)

    monkeypatch.setattr(packfile, "_decompress", counting)
    yield seen


def _thread(path: str, saves: int, chat: bool) -> int:
    """``saves`` saves of a chat (every message kept) or a rolling window of 20 messages, a
    pack flushed every save (merges all the time); the bytes of the newest state's messages."""
    store = CheckpointStore.open(path)
    store.refs.inline_max = 1
    messages: list[str] = []
    for i in range(saves):
        messages = messages + [f"message {i} " * 12]
        if not chat:
            messages = messages[-20:]
        store.save("t", {"messages": messages, "step": i})
    return sum(map(len, messages))


def _cold_load(path: str, saves: int, decompressed: list[int]) -> int:
    decompressed.clear()
    assert CheckpointStore.open(path).load("t").state["step"] == saves - 1
    return sum(decompressed)


def test_a_cold_load_decompresses_the_newest_state_not_the_history(
        tmp_path: Any, decompressed: list[int]) -> None:
    """A rolling window (the newest state the same size at 100 and 1,000 saves): a new store
    object loading the head decompresses no more at 1,000 saves than at 100, give or take
    what the newest merges hold. Old code: 49 KB at 100 saves, 500 KB at 1,000 (the merged
    packs the state's objects are spread through)."""
    got = {}
    for saves in (100, 1000):
        _thread(str(tmp_path / f"w{saves}"), saves, chat=False)
        got[saves] = _cold_load(str(tmp_path / f"w{saves}"), saves, decompressed)
    assert got[1000] <= 2 * got[100], got


def test_a_cold_load_of_a_chat_decompresses_about_its_state(
        tmp_path: Any, decompressed: list[int]) -> None:
    """A chat keeps every message: its newest state names nodes made at every step of the
    thread. A cold load decompresses at most twice the state's messages (old code: 5.4x)."""
    state = _thread(str(tmp_path / "c"), 1000, chat=True)
    assert _cold_load(str(tmp_path / "c"), 1000, decompressed) <= 2 * state


def _objects(n: int) -> dict[ObjectId, bytes]:
    data = b"CASN\x03\x00" + f"object {n} ".encode() * 30
    return {object_id(data): data}


def test_a_merge_keeps_what_the_newest_entries_reach_apart_and_writes_nothing_more() -> None:
    """Pure staging: three level-1 and three level-0 packs, and a save whose record names a
    node naming every 7th object of them. Its flush makes four level-0 packs (one level-1),
    then four level-1 packs merge into level 2: a history pack and a live pack (level LIVE +
    2) holding exactly what the record reaches; every object is written once, as before."""
    from cas_checkpoint.engine import live  # (new in this version)

    store: dict[ObjectId, bytes] = {}

    def read(ids: list[ObjectId]) -> dict[ObjectId, dict[ObjectId, Any]]:
        return {i: decode_pack(store[i]) for i in ids}

    packs: list[PackRef] = []
    everything: dict[ObjectId, bytes] = {}
    for level, first, n in [(1, 0, 10), (1, 10, 10), (1, 20, 10), (0, 30, 5), (0, 35, 5),
                            (0, 40, 5)]:
        objs = {k: v for i in range(first, first + n) for k, v in _objects(i).items()}
        everything.update(objs)
        ref, data = staging.make_pack(objs, level)
        store[ref.id] = data
        packs.append(ref)
    wanted = [oid for i, oid in enumerate(everything) if i % 7 == 0]
    node = encode_node(b"x", tuple(wanted))
    record = Record("t", (), object_id(node), 1, 0.0, 1)
    rec = record.encode()
    head = Head("t", CheckpointId(object_id(rec)), 1, tail=(record.entry(object_id(rec)),),
                packs=tuple(packs))
    out, written = staging.stage(head, {object_id(node): node, object_id(rec): rec}, read,
                                 inline_max=0)
    assert [p.level for p in out.packs] == [2, live.LIVE + 2]
    history, hot = (decode_pack(written[p.id]) for p in out.packs)
    assert set(hot) == {*wanted, object_id(node), object_id(rec)}
    assert not set(history) & set(hot)
    assert len(history) + len(hot) == len(everything) + 2 and len(written) == 2


class _Chat(TypedDict):
    messages: Annotated[list[str], operator.add]


def _graph(saver: Any) -> Any:
    from langgraph.graph import END, START, StateGraph

    def answer(state: _Chat) -> dict[str, Any]:
        return {"messages": [f"answer {len(state['messages'])} " * 10]}

    g = StateGraph(_Chat)
    g.add_node("answer", answer)
    g.add_edge(START, "answer")
    g.add_edge("answer", END)
    return g.compile(checkpointer=saver)


def test_a_new_saver_reads_a_long_threads_latest_state_in_two_rounds(tmp_path: Any) -> None:
    """A LangGraph thread long enough to have an archive (a pack every commit): a new saver's
    get_tuple is one read of the ref, then one parallel read of the packs of its newest
    entries (live.py), none of its history's or its archive's. Old code: three rounds (the
    ref, the archive's list, then every pack, the archived ones included), as
    bench_agent_app measured on S3 at 200 turns."""
    pytest.importorskip("langgraph")
    from cas_checkpoint.integrations.langgraph import CasSaver

    url = str(tmp_path / "s")
    saver = CasSaver.from_url(url)
    saver._core.refs.inline_max = 1
    graph = _graph(saver)
    config = {"configurable": {"thread_id": "chat"}}
    plain = CheckpointStore.open(url)

    def archived() -> bool:
        names = [n for n in plain.threads() if "chat" in n]
        ref = plain.refs.read(names[0]) if names else None
        return ref is not None and ref.head.archive is not None

    turns = 0  # (saves in flight together share commits: how many a turn makes varies)
    while turns < 150 or not archived() and turns < 600:
        graph.invoke({"messages": [f"question {turns} " * 10]}, config)
        turns += 1
    new = CasSaver.from_url(url)
    rounds: list[list[str]] = []
    backend = new._core.backend
    for method in ("get", "get_many", "read_ref", "read_refs"):
        real = getattr(backend, method)

        def counted(*a: Any, _real: Any = real, _m: str = method, **k: Any) -> Any:
            keys = a[0] if isinstance(a[0], list) else [a[0]]
            rounds.append([str(x) for x in keys])
            return _real(*a, **k)

        setattr(backend, method, counted)
    got = new.get_tuple(config)
    assert got is not None and len(got.checkpoint["channel_values"]["messages"]) == 2 * turns
    assert len(rounds) == 2, rounds
    assert all(k.startswith("packs/") for k in rounds[1]), rounds
    (name,) = [n for n in plain.threads() if "chat" in n]
    ref = plain.refs.read(name)
    assert ref is not None and ref.head.archive is not None  # (the thread has an archive)
    from cas_checkpoint.engine import live

    # the packs of its newest entries: not the history packs a live pack follows
    newest = live.newest(ref.head.packs)
    assert len(newest) < len(ref.head.packs)
    assert sorted(rounds[1]) == sorted(f"packs/{p.id[:2]}/{p.id[2:]}" for p in newest)


def test_a_repacked_thread_has_one_history_pack_then_its_live_pack(
        tmp_path: Any, decompressed: list[int]) -> None:
    """repack writes the thread's history in one pack at the highest merge level it had (a
    live pack's level counts as its merge's, so it is not taken for a live one), then what the
    newest entries reach in a live pack after it: a cold load right after the repack
    decompresses about the newest state, as before it (old code: one pack, the whole thread
    decompressed: 304 KB where 26 KB before the repack; now 33 KB)."""
    from cas_checkpoint.engine import live

    path = str(tmp_path / "r")
    _thread(path, 300, chat=False)
    store = CheckpointStore.open(path)
    before = store.refs.read("t")
    assert before is not None and any(live.is_live(p) for p in before.head.packs)
    cold_before = _cold_load(path, 300, decompressed)
    report = store.repack("t", min_garbage=0)
    after = store.refs.read("t")
    assert after is not None and len(after.head.packs) == 2
    history, hot = after.head.packs
    assert not live.is_live(history) and live.is_live(hot)
    assert history.level == live.level(hot) == max(live.level(p) for p in before.head.packs)
    assert report.threads[0].new_packs == (history, hot)
    assert _cold_load(path, 300, decompressed) <= 2 * cold_before


def test_a_dry_run_gc_counts_both_packs_a_repack_would_write(tmp_path: Any) -> None:
    """gc(repack=True, dry_run=True) marks the packs a repack would write, both of them: what
    it reports is what the run then does."""
    path = str(tmp_path / "d")
    _thread(path, 300, chat=False)
    store = CheckpointStore.open(path)
    from datetime import timedelta

    dry = store.gc(grace=timedelta(0), repack=True, min_garbage=0, dry_run=True)
    assert dry.repack is not None and len(dry.repack.threads[0].new_packs) == 2
    done = store.gc(grace=timedelta(0), repack=True, min_garbage=0)
    assert sorted(dry.deleted) == sorted(done.deleted)
    assert store.load("t").state["step"] == 299
