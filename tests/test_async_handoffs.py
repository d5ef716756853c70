"""How the async face moves work between the event loop and the local backend's thread pool
(``engine/steps.py``: ``arun``, ``_Handoff``): one hand-off to the pool per operation (a save,
a load, a group commit of the LangGraph saver), not one per storage request, so one wake-up of
the loop from a pool thread each. Counts, never times."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from builders import count_calls

from cas_checkpoint.aio import AsyncCheckpointStore
from cas_checkpoint.backends.local import LocalBackend
from cas_checkpoint.integrations.langgraph import CasSaver


class Handoffs:
    """Counts the calls handed to the backends' thread pools (``submit`` to the pool
    ``Backend.run_blocking`` and ``Backend.hand_off`` use: each is one trip to a pool thread
    and one wake-up of the loop), and every request (a sync method of the local backend) and
    the thread it ran on."""

    def __init__(self, mp: pytest.MonkeyPatch) -> None:
        self.n = 0
        self.requests: Counter[str] = Counter()
        self.on_loop = 0
        self.loop_thread: int | None = None
        real = ThreadPoolExecutor.submit

        def submit(pool: Any, fn: Any, /, *args: Any, **kw: Any) -> Any:
            if pool._thread_name_prefix.startswith("cas-checkpoint-io"):
                self.n += 1
            return real(pool, fn, *args, **kw)
        mp.setattr(ThreadPoolExecutor, "submit", submit)
        for name in ("get_many", "put_many", "read_ref", "read_refs", "write_ref",
                     "delete_ref", "list", "delete_many", "prepare_folders"):
            mp.setattr(LocalBackend, name, self._wrap(name, getattr(LocalBackend, name)))

    def _wrap(self, name: str, fn: Any) -> Any:
        def call(*a: Any, **kw: Any) -> Any:
            self.requests[name] += 1
            if threading.get_ident() == self.loop_thread:
                self.on_loop += 1
            return fn(*a, **kw)
        return call

    def clear(self) -> None:
        self.n = self.on_loop = 0
        self.requests.clear()


@pytest.fixture
def handoffs(monkeypatch: pytest.MonkeyPatch) -> Handoffs:
    return Handoffs(monkeypatch)


def test_a_save_and_a_load_are_one_hand_off_each(tmp_path: Path, handoffs: Handoffs) -> None:
    """A save that writes a pack and its ref, and a load that reads the ref and the pack:
    several requests each, one trip to the pool each (old code: one per request and one more
    for the save's encoding, 3 for the save and 2 for the load)."""
    async def main() -> tuple[int, int]:
        store = await AsyncCheckpointStore.open(str(tmp_path / "s"))
        handoffs.loop_thread = threading.get_ident()
        await store.save("t", {"n": 0})
        store2 = await AsyncCheckpointStore.open(str(tmp_path / "s"))
        handoffs.clear()
        state = {"pad": [f"{i}-" + "x" * 200 for i in range(200)]}  # (a pack, not inline)
        await store2.save("t", state)
        saves, save_requests = handoffs.n, sum(handoffs.requests.values())
        store3 = await AsyncCheckpointStore.open(str(tmp_path / "s"))
        handoffs.clear()
        assert (await store3.load("t")).state == state
        loads, load_requests = handoffs.n, sum(handoffs.requests.values())
        await store.aclose()
        await store2.aclose()
        await store3.aclose()
        assert save_requests >= 2 and load_requests >= 2, handoffs.requests
        assert handoffs.on_loop == 0  # (and no request ran on the loop's thread)
        return saves, loads

    assert asyncio.run(main()) == (1, 1)


def test_the_agent_benchmarks_turn_hands_off_once_per_commit(
        tmp_path: Path, handoffs: Handoffs, monkeypatch: pytest.MonkeyPatch) -> None:
    """The production shape (``benchmarks/bench_agent_app.py``: 21 aput, 19 aput_writes and 2
    aget_tuple a turn, in ~24 group commits): one trip to the pool per group commit and per
    read, none per request, and no request on the loop. Measured: 23 hand-offs a turn for 21
    commits and 2 reads (old code: 34.1 for 24.3 commits, a pack's write and the collected
    packs' deletion each a trip of their own, a new subgraph namespace's ref read another)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import bench_agent_app as bench

    calls = count_calls(monkeypatch, CasSaver, ("aget_tuple",))
    saver = CasSaver.from_url(tmp_path / "s")
    graph = bench.build_graph(saver, True)
    turns = 8

    async def main() -> int:
        handoffs.loop_thread = threading.get_ident()
        await graph.ainvoke(bench.human(0), bench.config("warm"))
        await graph.ainvoke(bench.human(0), bench.config("t"))
        handoffs.clear()
        calls.clear()
        commits = saver._groups.commits
        for t in range(1, turns + 1):
            await graph.ainvoke(bench.human(t), bench.config("t"))
        return saver._groups.commits - commits

    commits = asyncio.run(main())
    assert commits >= 20 * turns
    assert handoffs.on_loop == 0, handoffs.requests
    assert sum(handoffs.requests.values()) > handoffs.n  # (several requests in some trips)
    assert handoffs.n <= commits + calls["aget_tuple"], (handoffs.n, commits, calls,
                                                         handoffs.requests)


def test_a_save_and_a_load_wake_the_loop_a_few_times(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """What the loop runs for one save with a pack and one load on local disk: a few
    callbacks each (the hand-off's answer, the caller's wake-up), whatever the number of
    requests. Measured: 3 and 3 (old code: 28 and 8, a chain of futures and a shield per
    request)."""
    import asyncio.events

    ran = [0]
    real = asyncio.events.Handle._run

    def counted(handle: Any) -> None:
        ran[0] += 1
        real(handle)
    monkeypatch.setattr(asyncio.events.Handle, "_run", counted)

    async def main() -> tuple[int, int]:
        store = await AsyncCheckpointStore.open(str(tmp_path / "s"))
        await store.save("t", {"n": 0})
        store2 = await AsyncCheckpointStore.open(str(tmp_path / "s"))
        state = {"pad": [f"{i}-" + "x" * 200 for i in range(200)]}
        ran[0] = 0
        await store2.save("t", state)
        saving = ran[0]
        store3 = await AsyncCheckpointStore.open(str(tmp_path / "s"))
        ran[0] = 0
        await store3.load("t")
        loading = ran[0]
        for s in (store, store2, store3):
            await s.aclose()
        return saving, loading

    saving, loading = asyncio.run(main())
    assert saving <= 3 and loading <= 3, (saving, loading)


def test_a_save_answers_before_the_packs_its_commit_collected_are_deleted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The packs a commit's collector deletes (``refs._delete_packs``: ``DeleteMany(after=
    True)``) are deleted by the pool thread once the save has answered, not before: the first
    such deletion here waits until the save that made it has returned (old code: it never
    does, the save waiting for the deletion). The store stays whole and the packs go."""
    started = threading.Event()
    answered = threading.Event()
    waited: list[bool] = []
    real = LocalBackend.delete_many

    def delete_many(backend: Any, keys: Any) -> Any:
        if not waited:
            started.set()
            waited.append(answered.wait(5))
        return real(backend, keys)
    monkeypatch.setattr(LocalBackend, "delete_many", delete_many)

    async def main() -> None:
        store = await AsyncCheckpointStore.open(str(tmp_path / "s"))
        store._core.refs.collect_after = 0.0  # (a dropped pack is ripe at the next commit)
        state: dict[str, Any] = {"m": []}
        for i in range(60):
            state["m"].append(f"{i}-" + "x" * 400)
            await store.save("t", state)
            if started.is_set():
                answered.set()
        while not waited:  # (the deletion ran to its end in the pool)
            await asyncio.sleep(0.01)
        assert (await store.load("t")).state == state
        report = await store.verify()
        assert report.ok, report.to_text()
        await store.aclose()

    asyncio.run(main())
    assert waited == [True]
