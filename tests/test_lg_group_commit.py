"""Group commit in CasSaver's async face (``integrations/langgraph/group.py``): the ``aput`` and
``aput_writes`` calls of one thread in flight together share one compare-and-swap of its ref,
each caller gets its own answer or its own error, and nothing the per-thread lock guaranteed
before is lost. Counts, never times: ref compare-and-swaps (``write_ref``), fsyncs, calls."""

from __future__ import annotations

import asyncio
import operator
import os
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from builders import count_calls
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph

import cas_checkpoint.backends.local as local
from cas_checkpoint import ConflictError
from cas_checkpoint.aio import landed
from cas_checkpoint.backends.local import LocalBackend
from cas_checkpoint.integrations.langgraph import CasSaver


class Meter:
    """Counts ``write_ref`` calls and fsyncs (``os.fsync`` and the local backend's
    ``fdatasync``), and the threads the local backend's calls ran on."""

    def __init__(self, mp: pytest.MonkeyPatch) -> None:
        self.n: Counter[str] = Counter()
        self.threads: Counter[str] = Counter()  # "loop" / "other": where each I/O call ran
        self.loop_thread: int | None = None
        for name in ("get_many", "put_many", "read_ref", "read_refs", "write_ref",
                     "delete_ref", "list", "delete_many"):
            mp.setattr(LocalBackend, name, self._wrap(name, getattr(LocalBackend, name)))
        fsync, datasync = os.fsync, local._datasync
        mp.setattr(os, "fsync", self._wrap("fsync", fsync))
        mp.setattr(local, "_datasync", self._wrap("fsync", datasync))

    def _wrap(self, name: str, fn: Any) -> Any:
        def call(*a: Any, **kw: Any) -> Any:
            self.n[name] += 1
            on_loop = threading.get_ident() == self.loop_thread
            self.threads["loop" if on_loop else "other"] += 1
            return fn(*a, **kw)
        return call

    def clear(self) -> None:
        self.n.clear()
        self.threads.clear()


@pytest.fixture
def meter(monkeypatch: pytest.MonkeyPatch) -> Iterator[Meter]:
    yield Meter(monkeypatch)


def conf(thread: str, cid: str | None = None) -> RunnableConfig:
    c: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if cid is not None:
        c["checkpoint_id"] = cid
    return {"configurable": c}


def checkpoint(n: int) -> Any:
    return {**empty_checkpoint(), "channel_values": {"n": n, "pad": "x" * 3000}}


def test_calls_in_flight_together_share_one_compare_and_swap(tmp_path: Path,
                                                             meter: Meter) -> None:
    """A put and 8 pending writes issued at once: one ref write (old code: 9), at most one
    pack (3 fsyncs with the ref's; old code: 9 ref writes and their packs), and each caller
    its own answer: the checkpoint is the latest, with the 8 writes."""
    saver = CasSaver.from_url(tmp_path / "s")

    async def main() -> tuple[list[Any], Counter[str]]:
        meter.loop_thread = threading.get_ident()
        await saver.aput(conf("warm"), {**empty_checkpoint(), "channel_values": {
            "pad": "y" * 9000}}, {}, {})  # (its pack: the pack folders made)
        first = await saver.aput(conf("t"), checkpoint(0), {"step": 0}, {})
        meter.clear()
        got = await asyncio.gather(
            saver.aput(first, checkpoint(1), {"step": 1}, {}),
            *[saver.aput_writes(first, [("ch", i), ("other", f"v{i}")], f"task{i}")
              for i in range(8)])
        return got, Counter(meter.n)

    got, n = asyncio.run(main())
    assert n["write_ref"] == 1, n
    assert n["fsync"] <= 3, n
    assert got[0]["configurable"]["checkpoint_id"] != conf("t")  # the put's own config
    assert got[1:] == [None] * 8
    tup = saver.get_tuple(conf("t"))
    assert tup is not None and tup.checkpoint["channel_values"]["n"] == 1
    assert tup.config == got[0] or tup.config["configurable"]["checkpoint_id"] == \
        got[0]["configurable"]["checkpoint_id"]
    parent = tup.parent_config
    assert parent is not None
    before = saver.get_tuple(parent)
    assert before is not None
    assert sorted(w[0] for w in before.pending_writes if w[1] == "ch") == \
        [f"task{i}" for i in range(8)]
    assert {(w[0], w[2]) for w in before.pending_writes if w[1] == "ch"} == \
        {(f"task{i}", i) for i in range(8)}


class Fan(TypedDict, total=False):
    items: Annotated[list[str], operator.add]
    n: int


def fan_graph(saver: CasSaver) -> Any:
    """Three parallel workers a step (their pending writes land together), then a join."""
    g = StateGraph(Fan)

    def worker(name: str) -> Any:
        def run(state: Fan) -> Fan:
            return {"items": [f"{name}{state.get('n', 0)}"]}
        return run

    for name in ("a", "b", "c"):
        g.add_node(name, worker(name))
        g.add_edge(START, name)
        g.add_edge(name, "join")
    g.add_node("join", lambda s: {"n": s.get("n", 0) + 1})
    g.add_edge("join", END)
    return g.compile(checkpointer=saver)


def test_a_turn_makes_fewer_compare_and_swaps_than_calls(tmp_path: Path, meter: Meter,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """A fan-out graph under LangGraph's default durability ("async"): per turn 4 aput and 5
    aput_writes calls (3 of them at once). Old code: a compare-and-swap per call (9 a turn);
    now the concurrent ones share commits. Every turn's state and writes are as before, and
    no backend call and no fsync ran on the event loop's thread."""
    saver = CasSaver.from_url(tmp_path / "s")
    calls = count_calls(monkeypatch, CasSaver, ("aput", "aput_writes"))
    graph = fan_graph(saver)
    turns = 6

    async def main() -> None:
        meter.loop_thread = threading.get_ident()
        await graph.ainvoke({"items": []}, conf("warm"))
        meter.clear()
        calls.clear()
        for _ in range(turns):
            await graph.ainvoke({"items": []}, conf("t"))

    asyncio.run(main())
    n_calls = calls["aput"] + calls["aput_writes"]
    assert n_calls >= 9 * turns, calls
    # Each turn's 3 parallel writes go in one commit at most two (the first may start alone
    # while the others are still running): at least 2 commits a turn saved.
    # (measured: 30 ref writes for 54 calls; old code 54)
    assert meter.n["write_ref"] <= n_calls - 2 * turns, (meter.n, calls)
    # fsyncs: a ref write each, two a pack, and the new thread's file (measured: 46 in 6
    # turns; old code 75, 12.5 a turn)
    assert meter.n["fsync"] <= 9 * turns, meter.n
    assert meter.threads["loop"] == 0, meter.threads  # local I/O never blocks the loop
    state = graph.get_state(conf("t"))
    assert state.values["n"] == turns
    assert sorted(state.values["items"]) == sorted(f"{w}{i}" for i in range(turns)
                                                   for w in "abc")
    assert CasSaver.from_url(tmp_path / "s").get_tuple(conf("t")) is not None


def test_a_refused_part_does_not_sink_the_others(tmp_path: Path, meter: Meter) -> None:
    """``conflicts="raise"``: a put whose parent is not the latest checkpoint raises
    ConflictError in its own caller; the pending writes committed with it land (one ref
    write for all of them)."""
    saver = CasSaver.from_url(tmp_path / "s", conflicts="raise")

    async def main() -> list[Any]:
        first = await saver.aput(conf("t"), checkpoint(0), {"step": 0}, {})
        second = await saver.aput(first, checkpoint(1), {"step": 1}, {})
        meter.clear()
        return await asyncio.gather(
            saver.aput_writes(second, [("ch", 1)], "w1"),
            saver.aput(first, checkpoint(2), {"step": 1}, {}),  # stale: its parent is first
            saver.aput_writes(second, [("ch", 2)], "w2"),
            return_exceptions=True)

    got = asyncio.run(main())
    assert isinstance(got[1], ConflictError), got
    assert got[0] is None and got[2] is None
    assert meter.n["write_ref"] == 1
    tup = saver.get_tuple(conf("t"))
    assert tup is not None and tup.checkpoint["channel_values"]["n"] == 1
    assert sorted((w[0], w[2]) for w in tup.pending_writes) == [("w1", 1), ("w2", 2)]


@pytest.mark.parametrize("mode", ["keep", "raise"])
def test_two_writers_of_one_thread(tmp_path: Path, mode: str) -> None:
    """Two savers (two store objects: as two processes) each put a child of the same
    checkpoint with pending writes, all at once on one loop. ``keep``: both children stay,
    with their writes; ``raise``: exactly one put raises ConflictError, and every write
    lands."""
    url = tmp_path / "s"
    one = CasSaver.from_url(url, conflicts=mode)
    two = CasSaver.from_url(url, conflicts=mode)

    async def main() -> tuple[RunnableConfig, list[Any]]:
        first = await one.aput(conf("t"), checkpoint(0), {"step": 0}, {})
        calls = []
        for k, saver in enumerate((one, two)):
            calls += [saver.aput(first, checkpoint(10 + k), {"step": 1}, {}),
                      saver.aput_writes(first, [("ch", k)], f"task{k}")]
        return first, await asyncio.gather(*calls, return_exceptions=True)

    first, got = asyncio.run(main())
    puts, writes = got[0::2], got[1::2]
    assert writes == [None, None]
    saver = CasSaver.from_url(url)
    before = saver.get_tuple(first)
    assert before is not None
    assert sorted((w[0], w[2]) for w in before.pending_writes) == [("task0", 0), ("task1", 1)]
    listed = list(saver.list(conf("t")))
    if mode == "keep":
        assert all(isinstance(p, dict) for p in puts), puts
        assert len(listed) == 3
        for p in puts:
            tup = saver.get_tuple(p)
            assert tup is not None and tup.parent_config is not None
            assert tup.parent_config["configurable"]["checkpoint_id"] == \
                first["configurable"]["checkpoint_id"]
    else:
        assert sum(isinstance(p, ConflictError) for p in puts) == 1, puts
        assert len(listed) == 2


def test_cancelled_callers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a commit is held in its ref write: a call cancelled while its part waits in the
    queue for the next commit does not land, the others queued with it do; the call whose
    commit is under way, cancelled, lands and says so (``landed``)."""
    saver = CasSaver.from_url(tmp_path / "s")
    entered, release = threading.Event(), threading.Event()
    real = LocalBackend.write_ref

    def held(self: Any, *a: Any, **kw: Any) -> Any:
        entered.set()
        release.wait(60)
        return real(self, *a, **kw)

    async def main() -> tuple[Any, list[Any]]:
        first = await saver.aput(conf("t"), checkpoint(0), {"step": 0}, {})
        monkeypatch.setattr(LocalBackend, "write_ref", held)
        busy = asyncio.ensure_future(saver.aput_writes(first, [("ch", 0)], "t0"))
        while not entered.is_set():  # (the commit of t0 is in its ref write)
            await asyncio.sleep(0.001)
        queued = [asyncio.ensure_future(saver.aput_writes(first, [("ch", i)], f"t{i}"))
                  for i in (1, 2, 3)]
        for _ in range(3):
            await asyncio.sleep(0)  # each has queued its part
        queued[1].cancel()
        busy.cancel()
        for _ in range(3):
            await asyncio.sleep(0)
        release.set()
        try:
            await busy
            late = None
        except asyncio.CancelledError as exc:
            late = exc
        return late, await asyncio.gather(*queued, return_exceptions=True)

    late, got = asyncio.run(main())
    assert late is not None and landed(late) is not None  # t0 landed, and says so
    assert got[0] is None and got[2] is None
    assert isinstance(got[1], asyncio.CancelledError)
    tup = saver.get_tuple(conf("t"))
    assert tup is not None
    assert sorted(w[0] for w in tup.pending_writes) == ["t0", "t1", "t3"]


def test_memory_store_groups_too() -> None:
    """memory:// (its calls answer inline): the same grouping, the same answers."""
    saver = CasSaver.from_url(f"memory://group-{uuid.uuid4().hex[:8]}")

    async def main() -> int:
        first = await saver.aput(conf("t"), checkpoint(0), {"step": 0}, {})
        before = saver._groups.commits
        await asyncio.gather(*[saver.aput_writes(first, [("ch", i)], f"t{i}")
                               for i in range(5)])
        return saver._groups.commits - before

    assert asyncio.run(main()) == 1
    tup = saver.get_tuple(conf("t"))
    assert tup is not None and len(tup.pending_writes) == 5


def test_the_agent_benchmarks_turn(tmp_path: Path, meter: Meter,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The production shape (``benchmarks/bench_agent_app.py``: ~21 aput, ~19 aput_writes a
    turn, a subgraph namespace each turn): at most one ref write per aput and a few more (old
    code: one per call, 40 a turn), and no flush beyond a ref write's one, a pack's two and a
    new ref file's two, and the pack folders' parent once per batch of new pack folders (at
    most 9 in a store object's life: pack_folders.py; older code: the first time each folder
    was used, 7.4 a turn over 20 turns). Measured: 24 ref writes and 49 fsyncs a turn (old
    code: 40, 79; AsyncSqliteSaver: ~40 fsyncs)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import bench_agent_app as bench

    calls = count_calls(monkeypatch, CasSaver, ("aput",))
    whole = Counter[str]()
    write_tmp = LocalBackend._write_tmp

    def tmp(self: Any, path: str, data: bytes) -> str:
        whole["refs" if f"{os.sep}refs{os.sep}" in path else "packs"] += 1
        return write_tmp(self, path, data)
    monkeypatch.setattr(LocalBackend, "_write_tmp", tmp)
    saver = CasSaver.from_url(tmp_path / "s")
    graph = bench.build_graph(saver, True)
    turns = 8

    async def main() -> None:
        meter.loop_thread = threading.get_ident()
        await graph.ainvoke(bench.human(0), bench.config("warm"))
        meter.clear()
        calls.clear()
        whole.clear()
        for t in range(turns):
            await graph.ainvoke(bench.human(t), bench.config("t"))

    asyncio.run(main())
    assert calls["aput"] >= 20 * turns
    assert meter.n["write_ref"] <= calls["aput"] + 4 * turns, (meter.n, calls)
    # (a pack: its temp file, then its folder; a new ref file: the same; a slot: one)
    flushes = meter.n["write_ref"] - whole["refs"] + 2 * whole["packs"] + 2 * whole["refs"] + 9
    assert meter.n["fsync"] <= flushes, (meter.n, whole)
    assert meter.threads["loop"] == 0, meter.threads
    # the saver's heads hold 16 KB of new objects (saver.INLINE_BYTES), so about four commits
    # share a pack: measured 4.25 packs and 34 fsyncs a turn (with the store's 4 KB: 11.5 and
    # 49); AsyncSqliteSaver makes ~40 a turn of this graph (bench_agent_app, under strace)
    assert whole["packs"] <= 6 * turns, whole
    assert meter.n["fsync"] <= 40 * turns, meter.n


def test_pending_writes_wait_for_the_steps_put(tmp_path: Path, meter: Meter,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """LangGraph issues a step's pending writes just before the next checkpoint's put: a group
    of writes alone waits a few loop rounds (``group.JOIN_ROUNDS``) for that put to join, so
    in the agent benchmark's turn every commit carries a put: one commit and one slot flush
    per aput (old code: 24.3 commits a turn for 21 aput, a writes-only commit flushed ahead of
    a put making it wait). Writes that no put follows still land (the last test below)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import bench_agent_app as bench

    calls = count_calls(monkeypatch, CasSaver, ("aput",))
    saver = CasSaver.from_url(tmp_path / "s")
    graph = bench.build_graph(saver, True)
    turns = 8

    async def main() -> int:
        await graph.ainvoke(bench.human(0), bench.config("t"))
        calls.clear()
        meter.clear()
        commits = saver._groups.commits
        for t in range(1, turns + 1):
            await graph.ainvoke(bench.human(t), bench.config("t"))
        return saver._groups.commits - commits

    commits = asyncio.run(main())
    assert calls["aput"] >= 20 * turns
    assert commits == calls["aput"], (commits, calls)
    assert meter.n["write_ref"] == calls["aput"], (meter.n, calls)


def test_pending_writes_no_put_follows_land(tmp_path: Path) -> None:
    """Writes alone (no put comes) commit after their few rounds of waiting, each caller
    acknowledged once they are durable."""
    saver = CasSaver.from_url(tmp_path / "s")
    cfg = saver.put(conf("t"), checkpoint(0), {}, {})

    async def main() -> None:
        await asyncio.gather(*(saver.aput_writes(cfg, [("n", i)], f"task-{i}")
                               for i in range(3)))
        await saver.aput_writes(cfg, [("n", 9)], "task-9")

    asyncio.run(main())
    tup = CasSaver.from_url(tmp_path / "s").get_tuple(conf("t"))
    assert tup is not None and len(tup.pending_writes) == 4


def test_a_group_wakes_each_caller_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    """What the loop runs for ten concurrent aput_writes that share one commit: each caller's
    task is started, woken once with its answer and gathered (3 callbacks a call), plus the
    committer's few (its start, the rounds it waits for a put, the pool's answer). Measured:
    39 (old code: 60, each caller woken through a shield and the pool's answer through
    chained futures)."""
    import asyncio.events

    from cas_checkpoint.integrations.langgraph.group import JOIN_ROUNDS

    ran = [0]
    real = asyncio.events.Handle._run

    def counted(handle: Any) -> None:
        ran[0] += 1
        real(handle)
    monkeypatch.setattr(asyncio.events.Handle, "_run", counted)
    saver = CasSaver.from_url(tmp_path / "s")
    cfg = saver.put(conf("t"), checkpoint(0), {}, {})

    async def main() -> int:
        await saver.aput_writes(cfg, [("n", -1)], "warm")
        commits = saver._groups.commits
        ran[0] = 0
        await asyncio.gather(*(saver.aput_writes(cfg, [("n", i)], f"task-{i}")
                               for i in range(10)))
        assert saver._groups.commits == commits + 1
        return ran[0]

    assert asyncio.run(main()) <= 3 * 10 + JOIN_ROUNDS + 5


# --- the sync face (group.SyncGroups) -----------------------------------------------------------


def test_sync_calls_in_flight_together_share_one_commit(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """LangGraph's sync loop calls put_writes and put from a thread pool. While one commit of
    the thread is held up, the 8 pending writes that arrive go in the next commit together, and
    every caller returns with its save durable. Old code: one commit per call (9)."""
    saver = CasSaver.from_url(tmp_path / "s")
    first = saver.put(conf("t"), checkpoint(0), {"step": 0}, {})
    gate, entered = threading.Event(), threading.Event()
    real = LocalBackend.write_ref
    held = [True]

    def write_ref(self: Any, *a: Any, **kw: Any) -> Any:
        if held[0]:
            held[0] = False
            entered.set()
            assert gate.wait(30)
        return real(self, *a, **kw)

    monkeypatch.setattr(LocalBackend, "write_ref", write_ref)
    before = saver._sync.commits
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            saver.put_writes(first, [(f"c{i}", i)], f"task{i}")
        except BaseException as exc:  # (reported below)
            errors.append(exc)

    _held_then_queued(saver, write, entered, gate)
    assert not errors, errors
    assert saver._sync.commits - before == 2
    got = CasSaver.from_url(tmp_path / "s").get_tuple(first)
    assert got is not None
    assert sorted(v for _, _, v in got.pending_writes) == list(range(9))


def test_a_sync_turn_makes_fewer_commits_than_calls(tmp_path: Path, meter: Meter,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The fan-out graph through ``invoke``: the concurrent calls share commits (old code: a
    compare-and-swap per call), and every turn's state is as before."""
    saver = CasSaver.from_url(tmp_path / "s")
    calls = count_calls(monkeypatch, CasSaver, ("put", "put_writes"))
    graph = fan_graph(saver)
    turns = 6
    graph.invoke({"items": []}, conf("warm"))
    meter.clear()
    calls.clear()
    for _ in range(turns):
        graph.invoke({"items": []}, conf("t"))
    n_calls = calls["put"] + calls["put_writes"]
    assert n_calls >= 9 * turns, calls
    assert meter.n["write_ref"] < n_calls, (meter.n, calls)
    state = graph.get_state(conf("t"))
    assert state.values["n"] == turns
    assert sorted(state.values["items"]) == sorted(f"{w}{i}" for i in range(turns)
                                                   for w in "abc")


def test_a_failed_sync_commit_fails_each_of_its_callers_and_not_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The storage refuses the commit that holds 8 queued pending writes: each of their callers
    gets that error (none hangs, none reports a save that did not land), and the thread's
    next save commits (the queue's leadership was handed on)."""
    from cas_checkpoint.errors import StorageError

    saver = CasSaver.from_url(tmp_path / "s")
    first = saver.put(conf("t"), checkpoint(0), {"step": 0}, {})
    gate, entered = threading.Event(), threading.Event()
    real = LocalBackend.write_ref
    seen = [0]

    def write_ref(self: Any, *a: Any, **kw: Any) -> Any:
        seen[0] += 1
        if seen[0] == 1:  # the first commit: held until the others queue
            entered.set()
            assert gate.wait(30)
        elif seen[0] == 2:  # the next one, holding the 8: refused
            raise StorageError("the disk is full; free space and save again")
        return real(self, *a, **kw)

    monkeypatch.setattr(LocalBackend, "write_ref", write_ref)
    outcomes: dict[int, BaseException | None] = {}

    def write(i: int) -> None:
        try:
            saver.put_writes(first, [(f"c{i}", i)], f"task{i}")
            outcomes[i] = None
        except BaseException as exc:  # (checked below)
            outcomes[i] = exc

    threads = _held_then_queued(saver, write, entered, gate)
    assert not any(t.is_alive() for t in threads)
    assert outcomes[0] is None
    assert all(isinstance(outcomes[i], StorageError) for i in range(1, 9)), outcomes
    saver.put_writes(first, [("after", 99)], "task-after")  # not stuck
    got = CasSaver.from_url(tmp_path / "s").get_tuple(first)
    assert got is not None
    assert sorted(v for _, _, v in got.pending_writes) == [0, 99]


def _held_then_queued(saver: Any, write: Any, entered: threading.Event,
                      gate: threading.Event) -> list[threading.Thread]:
    """Caller 0's commit starts and is held (``entered``, until ``gate``); callers 1-8 arrive
    meanwhile and queue; then the commit is let go and every caller is waited for."""
    threads = [threading.Thread(target=write, args=(0,))]
    threads[0].start()
    assert entered.wait(30)  # the first commit is in flight, held
    threads += [threading.Thread(target=write, args=(i,)) for i in range(1, 9)]
    for t in threads[1:]:
        t.start()
    while sum(len(q) for q in saver._sync._queues.values()) < 8:
        threading.Event().wait(0.01)
    gate.set()
    for t in threads:
        t.join(30)
    return threads
