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


def test_a_dropped_async_saver_is_freed_at_once_with_its_pool_thread(store_url: str,
                                                                      no_gc: None) -> None:
    """The async face: a new saver's ``aget_tuple`` then ``aclose``, dropped: freed by
    reference counting, and the thread its backend started for local disk ends with it (old
    code: the saver, its store object and that thread stayed until a collector's pass)."""
    threads = threading.active_count()

    async def read() -> weakref.ref[CasSaver]:
        async with CasSaver.from_url(store_url) as saver:
            got = await saver.aget_tuple(CONFIG)
            assert got is not None and len(got.checkpoint["channel_values"]["messages"]) == 10
        return weakref.ref(saver)

    alive = asyncio.run(read())
    assert alive() is None
    assert _cyclic_garbage() == 0
    for t in threading.enumerate():  # a pool thread ends once it sees its pool gone
        if t.name.startswith("cas-checkpoint-io"):
            t.join(5)
    assert threading.active_count() <= threads


def test_a_sync_put_through_a_dropped_saver_leaves_no_cycle(tmp_path: Any, no_gc: None) -> None:
    """The sync face's puts (their group commit) leave no cycle either: a saver that ran a
    turn and is dropped is freed at once."""
    saver = CasSaver.from_url(str(tmp_path / "s"))
    _graph(saver).invoke({"messages": ["question"]}, CONFIG)
    alive = weakref.ref(saver)
    del saver
    assert alive() is None
