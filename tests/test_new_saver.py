"""The fixed costs of a NEW saver reading a thread's latest state (issue 29: "latest-state read
<= SqliteSaver's", where the benchmark opens a saver per read): what a saver leaves behind once
dropped, and what it starts. Counted, not timed."""

from __future__ import annotations

import asyncio
import gc
import operator
import threading
import weakref
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from cas_checkpoint.backends import Backend  # noqa: E402
from cas_checkpoint.integrations.langgraph import CasSaver  # noqa: E402

CONFIG: Any = {"configurable": {"thread_id": "chat"}}


class _Chat(TypedDict):
    messages: Annotated[list[str], operator.add]


def _graph(saver: Any) -> Any:
    from langgraph.graph import END, START, StateGraph

    def answer(state: _Chat) -> dict[str, Any]:
        return {"messages": [f"answer {len(state['messages'])}"]}

    g = StateGraph(_Chat)
    g.add_node("answer", answer)
    g.add_edge(START, "answer")
    g.add_edge("answer", END)
    return g.compile(checkpointer=saver)


@pytest.fixture
def store_url(tmp_path: Any) -> str:
    """A folder holding a LangGraph thread of 5 turns (through the sync face)."""
    url = str(tmp_path / "s")
    graph = _graph(CasSaver.from_url(url))
    for i in range(5):
        graph.invoke({"messages": [f"question {i}"]}, CONFIG)
    return url


@pytest.fixture
def no_gc() -> Iterator[None]:
    """The cycle collector off: what is freed now is freed by reference counting alone."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _cyclic_garbage() -> int:
    """How many objects only the cycle collector could free."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = len(gc.garbage)
    finally:
        gc.set_debug(0)
        del gc.garbage[:]
    return found


def test_a_dropped_saver_is_freed_at_once_with_its_store_object(store_url: str,
                                                                no_gc: None) -> None:
    """A new saver per request (the benchmark's "latest state, new saver"; a web handler): once
    it has read the latest state and is dropped, reference counting frees it, its store object
    and their caches; the cycle collector finds nothing of it. Old code: 148 objects in two
    cycles (the saver and its sync group commit's bound method; the object store and the views
    it keeps, each holding it back), freed only by the collector's passes, whose full ones
    walk the whole heap."""
    saver = CasSaver.from_url(store_url)
    got = saver.get_tuple(CONFIG)
    assert got is not None and len(got.checkpoint["channel_values"]["messages"]) == 10
    alive = weakref.ref(saver)
    store = weakref.ref(saver.store)
    del saver, got
    assert alive() is None and store() is None
    assert _cyclic_garbage() == 0


def test_a_dropped_async_saver_is_freed_at_once_and_new_ones_start_no_pool_each(
        store_url: str, no_gc: None) -> None:
    """The async face: a new saver's ``aget_tuple`` then ``aclose``, dropped: freed by
    reference counting; and new savers' reads share the process's pool of local-disk threads:
    12 of them after a first start fewer than ``Backend.async_threads`` threads in all (the
    pool starts one when none is idle yet; old code: one each, kept by a pool per saver until
    a collector's pass freed the saver and its store object)."""
    started: list[str] = []
    real = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        started.append(thread.name)
        real(thread)

    async def read() -> weakref.ref[CasSaver]:
        async with CasSaver.from_url(store_url) as saver:
            got = await saver.aget_tuple(CONFIG)
            assert got is not None and len(got.checkpoint["channel_values"]["messages"]) == 10
        return weakref.ref(saver)

    async def reads() -> list[weakref.ref[CasSaver]]:
        first = [await read()]
        threading.Thread.start = start  # type: ignore[method-assign]
        try:
            return first + [await read() for _ in range(12)]
        finally:
            threading.Thread.start = real  # type: ignore[method-assign]

    alive = asyncio.run(reads())
    assert [a() for a in alive] == [None] * 13
    assert _cyclic_garbage() == 0
    assert len(started) < Backend.async_threads, started


def test_a_sync_put_through_a_dropped_saver_leaves_no_cycle(tmp_path: Any, no_gc: None) -> None:
    """The sync face's puts (their group commit) leave no cycle either: a saver that ran a
    turn and is dropped is freed at once."""
    saver = CasSaver.from_url(str(tmp_path / "s"))
    _graph(saver).invoke({"messages": ["question"]}, CONFIG)
    alive = weakref.ref(saver)
    del saver
    assert alive() is None


def test_a_forked_child_runs_the_async_face_on_a_pool_of_its_own(tmp_path: Any) -> None:
    """The process's pool is not inherited: a child forked after the parent's async reads
    starts its own threads (the parent's are not in it) and its read answers."""
    import multiprocessing

    from cas_checkpoint import AsyncCheckpointStore

    url = str(tmp_path / "s")

    async def save_and_load(value: int) -> int:
        store = await AsyncCheckpointStore.open(url)
        await store.save("t", {"n": value})
        got = (await store.load("t")).state["n"]
        await store.aclose()
        return int(got)

    assert asyncio.run(save_and_load(1)) == 1  # the parent's pool has started
    child = multiprocessing.get_context("fork").Process(
        target=lambda: asyncio.run(save_and_load(2)))
    child.start()
    child.join(20)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail("the forked child's async read hung (its pool held the parent's threads)")
    assert child.exitcode == 0


def test_a_stalled_device_does_not_hold_the_async_face_of_a_store_on_another(
        tmp_path: Any) -> None:
    """The async face's threads are shared one pool a device: a store whose disk stalls
    (every pool thread blocked in its calls) leaves a store on another device answering."""
    import os

    from cas_checkpoint import AsyncCheckpointStore
    from cas_checkpoint.backends.local import LocalBackend

    other = "/dev/shm"
    if not os.path.isdir(other) or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs a second device: /dev/shm beside the test's folder")
    far = os.path.join(other, f"cas-stall-{os.getpid()}-{id(tmp_path)}")
    stalled = LocalBackend(str(tmp_path / "stalled"))
    release = threading.Event()
    blocked = [stalled.hand_off(release.wait, 30) for _ in range(Backend.async_threads)]

    async def save_and_load() -> int:
        store = await AsyncCheckpointStore.open(far)
        await store.save("t", {"n": 7})
        got = (await store.load("t")).state["n"]
        await store.aclose()
        return int(got)

    try:
        assert asyncio.run(asyncio.wait_for(save_and_load(), 10)) == 7
        assert not any(f.done() for f in blocked)  # (the stall held all along)
    except TimeoutError:
        pytest.fail("a store on another device waited for the stalled device's threads")
    finally:
        release.set()
        import shutil

        shutil.rmtree(far, ignore_errors=True)
    assert all(f.result(10) for f in blocked)


def test_a_new_saver_registers_no_default_class_again(store_url: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The classes every saver constructs (LangChain's messages, LangGraph's types) are
    registered once a process: a new saver copies them (old code: 19 registrations a saver,
    ~60-90 us of its ~0.6 ms latest-state read at 10 messages). Its registry is its own: a
    class one saver learns is not in another's."""
    from cas_checkpoint.format.extypes import TypeRegistry

    CasSaver.from_url(store_url)
    calls: list[type] = []
    real = TypeRegistry.register

    def register(reg: TypeRegistry, cls: type, *a: Any, **k: Any) -> None:
        calls.append(cls)
        real(reg, cls, *a, **k)

    monkeypatch.setattr(TypeRegistry, "register", register)
    saver = CasSaver.from_url(store_url)
    assert calls == []
    got = saver.get_tuple(CONFIG)
    assert got is not None and len(got.checkpoint["channel_values"]["messages"]) == 10

    import dataclasses

    @dataclasses.dataclass
    class Mine:
        n: int

    saver._core.types.register(Mine)
    assert Mine in saver._core.types and Mine not in CasSaver.from_url(store_url)._core.types
