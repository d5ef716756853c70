"""Saves to one thread from many threads or tasks of one process take turns (``serial.py``)
instead of racing through the compare-and-swap; every save still lands. And a writer that lost
a race asks whether the head holds its entry by reading only down to the head it built on.

A lost race is counted from the store's debug log ("moved under us"), the line every lost
compare-and-swap writes: a count, not a time."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cas_checkpoint import CheckpointStore
from cas_checkpoint.aio import AsyncCheckpointStore
from cas_checkpoint.format.objects import CheckpointId, LogEntry


class _Races(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lost = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "moved under us" in record.getMessage():
            self.lost += 1


@pytest.fixture
def races() -> Iterator[_Races]:
    handler = _Races()
    log = logging.getLogger("cas_checkpoint")
    old = log.level
    log.setLevel(logging.DEBUG)
    log.addHandler(handler)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(old)


def _state(i: int) -> dict[str, Any]:
    return {"messages": [f"message {j} " * 20 for j in range(i % 7 + 1)], "i": i}


def test_threads_of_one_process_take_turns_on_one_thread(tmp_path: Path, races: _Races
                                                         ) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.save("t", _state(0))
    start = threading.Barrier(8)
    ids: list[CheckpointId] = []

    def writer(w: int) -> None:
        start.wait()
        for i in range(10):
            ids.append(store.save("t", _state(w * 100 + i)).id)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert races.lost == 0  # (without the turns: 9-23 lost races in the runs tried)
    history = CheckpointStore.open(store.url).history("t")
    assert len(history) == 81 and {h.id for h in history} >= set(ids)
    for newer, older in zip(history, history[1:], strict=False):  # one chain: each on the last
        assert newer.parent_ids == (older.id,)
    assert len(store._core.turns) == 0  # no lock is kept once nobody waits


def test_tasks_of_one_loop_take_turns_on_one_thread(tmp_path: Path, races: _Races) -> None:
    async def main() -> list[CheckpointId]:
        store = await AsyncCheckpointStore.open(str(tmp_path / "s"))
        try:
            await store.save("t", _state(0))

            async def writer(w: int) -> list[CheckpointId]:
                return [(await store.save("t", _state(w * 100 + i))).id for i in range(5)]

            got = await asyncio.gather(*(writer(w) for w in range(16)))
            assert len(store._core.turns) == 0
            return [i for ids in got for i in ids]
        finally:
            await store.aclose()

    ids = asyncio.run(main())
    assert races.lost == 0  # (without the turns: 90-141 lost races in the runs tried)
    history = CheckpointStore.open(str(tmp_path / "s")).history("t")
    assert len(history) == 81 and {h.id for h in history} >= set(ids)


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_langgraph_loop_on_local_disk_loses_no_race(face: str, tmp_path: Path,
                                                      races: _Races) -> None:
    """LangGraph calls put and put_writes from a pool of threads (or as concurrent tasks):
    on local disk the async loop lost ~7,600 races in 805 saves before the turns (6.3 s
    instead of 1.4 s for 200 steps)."""
    pytest.importorskip("langgraph")
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langgraph.graph import END, START, MessagesState, StateGraph

    from cas_checkpoint.integrations.langgraph import CasSaver

    steps = 15

    def model(state: MessagesState) -> dict[str, Any]:
        done = sum(isinstance(m, ToolMessage) for m in state["messages"])
        if done >= steps:
            return {"messages": [AIMessage(content="done", id="ai-final")]}
        call = {"name": "search", "args": {"q": done}, "id": f"call-{done}", "type": "tool_call"}
        return {"messages": [AIMessage(content=f"step {done}", tool_calls=[call],
                                       id=f"ai-{done}")]}

    def tool(state: MessagesState) -> dict[str, Any]:
        call = state["messages"][-1].tool_calls[0]  # type: ignore[union-attr]
        return {"messages": [ToolMessage(content="result " * 30, tool_call_id=call["id"],
                                         id=f"tool-{call['id']}")]}

    g = StateGraph(MessagesState)
    g.add_node("model", model)
    g.add_node("tool", tool)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "tool" if s["messages"][-1].tool_calls
                            else END, ["tool", END])
    g.add_edge("tool", "model")
    saver = CasSaver.from_url(str(tmp_path / "s"))
    graph = g.compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "t"}}
    start = {"messages": [HumanMessage(content="go", id="h0")]}
    if face == "sync":
        out = graph.invoke(start, config)
    else:
        out = asyncio.run(graph.ainvoke(start, config))
    assert len(out["messages"]) == 2 * steps + 2
    assert races.lost == 0  # (without the turns: 14-34 sync, 86-108 async in the runs tried)
    assert len(list(saver.list(config))) == 2 * steps + 3  # every checkpoint landed
    got = CasSaver.from_url(str(tmp_path / "s")).get_tuple(config)
    assert got is not None and len(got.checkpoint["channel_values"]["messages"]) == 2 * steps + 2


def test_a_lost_race_reads_the_log_only_down_to_the_head_it_built_on(tmp_path: Path) -> None:
    """``holds`` after a lost race: an entry without parents (a LangGraph pending write) used
    to make it read the thread's whole log; it stops at the head the entry was appended to."""
    store = CheckpointStore.open(str(tmp_path / "s"))
    for i in range(60):  # a log in segments, not only a tail
        store.save("t", {"i": i})
    ref = store.refs.read("t")
    assert ref is not None and ref.head.peaks
    hist = store.history("t")
    base = hist[3].id  # the head a lost attempt was built on: three saves landed since
    mine = LogEntry(CheckpointId("ab" * 32), (), 60, 0.0, 1)  # not in the log
    read: list[CheckpointId] = []
    refs = store._core.refs
    real = refs.iter_newest_first

    def counting(head: Any, view: Any) -> Iterator[LogEntry]:
        for entry in real(head, view):
            read.append(entry.id)
            yield entry

    refs.iter_newest_first = counting  # type: ignore[method-assign]
    assert not store._run(refs.holds(ref.head, mine, base))
    assert read == [h.id for h in hist[:4]]  # down to the base, not all 60
    read.clear()
    assert not store._run(refs.holds(ref.head, mine))  # no base, no parents: all of it
    assert len(read) == 60
    landed = LogEntry(hist[1].id, (), 58, 0.0, 1)  # an entry above the base is found
    assert store._run(refs.holds(ref.head, landed, base))


def test_a_new_savers_get_tuple_reads_no_whole_log(tmp_path: Path) -> None:
    """``get_tuple`` (and ``list``) of a new saver find both the checkpoint and its pending
    writes without reading the whole log (they read it twice, then once, before; how few
    entries they read is tests/test_lg_o1.py's)."""
    pytest.importorskip("langgraph")
    from langchain_core.messages import AIMessage
    from langgraph.graph import START, MessagesState, StateGraph

    from cas_checkpoint.integrations.langgraph import CasSaver

    g = StateGraph(MessagesState)
    g.add_node("say", lambda s: {"messages": [AIMessage(content=f"hi {len(s['messages'])}")]})
    g.add_edge(START, "say")
    url = str(tmp_path / "s")
    graph = g.compile(checkpointer=CasSaver.from_url(url))
    config: Any = {"configurable": {"thread_id": "t"}}
    for _ in range(12):  # a log in segments, writes among the checkpoints
        graph.invoke({"messages": [("user", "hello")]}, config)
    saver = CasSaver.from_url(url)
    calls: list[int | None] = []
    real = saver._core.history

    def counting(*args: Any, **kw: Any) -> Any:
        calls.append(kw.get("limit"))
        return real(*args, **kw)

    saver._core.history = counting  # type: ignore[method-assign]
    got = saver.get_tuple(config)
    assert got is not None and len(got.checkpoint["channel_values"]["messages"]) == 24
    assert calls == []  # no read of the whole log: the head back to what it needs (cursor.py)
    assert len(list(saver.list(config, limit=3))) == 3
    assert calls == []


def test_a_task_cancelled_while_waiting_its_turn_leaves_no_lock(tmp_path: Path) -> None:
    """A save cancelled while it waits for its turn (a stalled writer holds it) does not land,
    leaves no lock behind, and the saves after it still run."""
    async def main() -> None:
        store = await AsyncCheckpointStore.open(str(tmp_path / "s"))
        try:
            turns = store._core.turns
            async with turns.ahold("t"):  # a stalled writer's turn
                waiting = asyncio.create_task(store.save("t", _state(1)))
                await asyncio.sleep(0.05)
                assert not waiting.done()  # it waits: it does not race around the holder
                waiting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiting
            assert len(turns) == 0
            await store.save("t", _state(2))
            assert len(await store.history("t")) == 1  # the cancelled save never ran
        finally:
            await store.aclose()

    asyncio.run(main())
