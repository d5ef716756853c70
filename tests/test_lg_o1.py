"""CasSaver's per-step reads cost what the head holds, not the thread's length (ARCHITECTURE.md
#13, issue 29): the log entries a turn of a real tool-calling agent reads, and those of one
get_tuple, one put's parent lookup and one list(limit=10), are the same at turn 10 and at turn
300. And the early stop is exact: random puts (ids out of order, writes before their
checkpoint, deleted runs) read back as InMemorySaver / a full walk of the log says, and a
thread written before the bounds existed reads correctly and gains them on its next put."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import copy_checkpoint, empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import _messages_delta_reducer, add_messages
from langgraph.types import Send

from cas_checkpoint.engine.core import Core
from cas_checkpoint.engine.refs import RefStore
from cas_checkpoint.format.heads import Head
from cas_checkpoint.format.objects import LogEntry, Segment
from cas_checkpoint.integrations.langgraph import CasSaver


class Reads:
    """Log entries read: yielded by the newest-first walk or returned whole (``entries``),
    and those decoded from segments (packs)."""

    walked = 0
    decoded = 0

    @classmethod
    def take(cls) -> tuple[int, int]:
        got = (cls.walked, cls.decoded)
        cls.walked = cls.decoded = 0
        return got


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> type[Reads]:
    tail, segments = RefStore.iter_tail, RefStore.iter_segments
    whole, decode = RefStore.log_entries, Segment.decode

    # (the newest-first walk is the tail's entries, then the segments': iter_newest_first
    # reads through both, a save's stamp through the tail first: Steps._ask)
    def iter_tail(head: Head) -> Iterator[LogEntry]:
        for entry in tail(head):
            Reads.walked += 1
            yield entry

    def iter_segments(self: RefStore, head: Head, view: Any) -> Iterator[LogEntry]:
        for entry in segments(self, head, view):
            Reads.walked += 1
            yield entry

    def log_entries(self: RefStore, head: Head, view: Any) -> list[LogEntry]:
        got = whole(self, head, view)
        Reads.walked += len(got)
        return got

    def seg_decode(data: Any) -> Segment:
        seg = decode(data)
        Reads.decoded += len(seg.entries)
        return seg

    monkeypatch.setattr(RefStore, "iter_tail", staticmethod(iter_tail))
    monkeypatch.setattr(RefStore, "iter_segments", iter_segments)
    monkeypatch.setattr(RefStore, "log_entries", log_entries)
    monkeypatch.setattr(Segment, "decode", staticmethod(seg_decode))
    Reads.take()
    return Reads


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def agent(saver: Any) -> Any:
    """A scripted tool-calling loop: a human message makes the model call two tools, which
    run as concurrent tasks (each its own pending writes), then the model answers."""

    def model(state: State) -> dict[str, Any]:
        n = len(state["messages"])
        if isinstance(state["messages"][-1], HumanMessage):
            calls = [{"name": "lookup", "args": {"i": k}, "id": f"c{n}-{k}", "type": "tool_call"}
                     for k in range(2)]
            return {"messages": [AIMessage("", tool_calls=calls, id=f"ai{n}")]}
        return {"messages": [AIMessage(f"answer {n}", id=f"ai{n}")]}

    def route(state: State) -> Any:
        last = state["messages"][-1]
        if isinstance(last, AIMessage) and last.tool_calls:
            return [Send("tool", call) for call in last.tool_calls]
        return END

    def tool(call: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [ToolMessage(f"result {call['args']['i']}", tool_call_id=call["id"],
                                         id=f"t-{call['id']}")]}

    b = StateGraph(State)
    b.add_node("model", model)
    b.add_node("tool", tool)
    b.add_edge(START, "model")
    b.add_conditional_edges("model", route, ["tool", END])
    b.add_edge("tool", "model")
    return b.compile(checkpointer=saver)


def cfg(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id}}


async def measure(saver: CasSaver, graph: Any, thread: str, turn: int
                  ) -> dict[str, tuple[int, int]]:
    """Entries read by one turn, then by an aget_tuple, an alist(limit=10) and an aput (its
    parent lookup and its bound) on a copy of the thread. (The async face, as a production
    agent runs: its writes land in the same order every turn. With the sync face LangGraph's
    thread pool lands a task's writes before or after the next checkpoint by timing, so a
    turn's log, and what a read walks, differs by an entry from run to run.)"""
    out = {}
    Reads.take()
    await graph.ainvoke({"messages": [HumanMessage(f"question {turn}", id=f"h{turn}")]},
                        cfg(thread))
    out["turn"] = Reads.take()
    tup = await saver.aget_tuple(cfg(thread))
    out["get_tuple"] = Reads.take()
    assert tup is not None and len([t async for t in saver.alist(cfg(thread), limit=10)]) == 10
    out["list"] = Reads.take()
    copy = f"{thread}-copy{turn}"
    await saver.acopy_thread(thread, copy)
    cp = copy_checkpoint(tup.checkpoint)
    cp["id"] = str(uuid.UUID(int=uuid.UUID(cp["id"]).int + 1))
    conf: RunnableConfig = {"configurable": {**tup.config["configurable"], "thread_id": copy}}
    Reads.take()
    await saver.aput(conf, cp, tup.metadata, {})
    out["put"] = Reads.take()
    return out


def test_a_turn_reads_the_same_at_turn_10_and_turn_300(counted: type[Reads]) -> None:
    saver = CasSaver.from_url(f"memory://o1-{uuid.uuid4().hex[:8]}")
    graph = agent(saver)

    async def turns() -> dict[int, dict[str, tuple[int, int]]]:
        got = {}
        for turn in range(1, 301):
            if turn in (10, 298, 300):
                got[turn] = await measure(saver, graph, "t", turn)
            else:
                await graph.ainvoke({"messages": [HumanMessage(f"question {turn}",
                                                               id=f"h{turn}")]}, cfg("t"))
        return got

    got = asyncio.run(turns())
    # 5 checkpoints (the input's, model, tools, model, and the first step's) and 5 writes a turn
    assert saver.store.count('lg:["t",""]') == 300 * 10
    walked = {turn: {op: n[0] for op, n in ops.items()} for turn, ops in got.items()}
    print(got)
    assert walked[10] == walked[298] == walked[300]
    assert walked[300]["get_tuple"] <= 10 and walked[300]["list"] <= 80  # the head's few
    # Entries decoded from the log's segments: the same where the log's 16-entry leaves fall
    # alike (10 entries a turn: turns 10 and 298), and a leaf or two at most otherwise.
    assert got[10] == got[298]
    assert all(n[1] <= 16 * ((n[0] + 15) // 16 + 1) for n in got[300].values())


def test_get_tuple_reads_the_same_at_20_and_400_checkpoints(counted: type[Reads]) -> None:
    """Through the public saver API (put, put_writes): get_tuple walks the latest checkpoint,
    its writes and its parent's entry, however long the thread."""
    saver = CasSaver.from_url(f"memory://o1-{uuid.uuid4().hex[:8]}")
    reads = []
    for n in (20, 400):
        thread = f"w{n}"
        conf: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        for i in range(n):
            cp = empty_checkpoint()
            conf = saver.put(conf, cp, {"step": i, "source": "loop", "parents": {}}, {})
            saver.put_writes(conf, [("x", i)], f"task{i}")
        Reads.take()
        tup = saver.get_tuple(cfg(thread))
        reads.append(Reads.take())
        assert tup is not None and tup.pending_writes == [(f"task{n - 1}", "x", n - 1)]
    assert reads[0][0] == reads[1][0] == 4
    assert reads[1][1] <= 16  # one leaf when the head's own entries were flushed to one


# --- exactness ---------------------------------------------------------------------------------


def _ids(rnd: random.Random, n: int) -> list[str]:
    return sorted(str(uuid.UUID(int=rnd.getrandbits(128))) for _ in range(n))


def _plain(t: Any) -> Any:
    if t is None:
        return None
    parent = t.parent_config["configurable"]["checkpoint_id"] if t.parent_config else None
    return (t.config["configurable"]["checkpoint_id"], parent,
            sorted(t.pending_writes), t.checkpoint["id"])


@pytest.mark.parametrize("seed", range(6))
def test_reads_stop_early_and_exactly(seed: int, tmp_path: Any) -> None:
    """Puts in a shuffled id order (copied threads, replays), parents anywhere, writes put
    before their checkpoint and after later ones: CasSaver reads back what InMemorySaver does."""
    rnd = random.Random(seed)
    cas = CasSaver.from_url(str(tmp_path / "s") if seed % 2 else f"memory://o1x-{seed}")
    ref = InMemorySaver()
    ids = _ids(rnd, 40)
    order = ids[:]
    for _ in range(8):  # mostly increasing, some out of order
        i, j = rnd.randrange(40), rnd.randrange(40)
        order[i], order[j] = order[j], order[i]
    put: list[str] = []
    thread = "x"
    for n, lg in enumerate(order):
        for _ in range(rnd.randrange(3)):  # writes: to a put checkpoint, or an early one
            target = rnd.choice(put + [lg]) if put else lg
            w = [("ch", f"{target[:4]}-{n}-{rnd.random():.3f}")]
            task = f"task{rnd.randrange(3)}"
            conf = {"configurable": {"thread_id": thread, "checkpoint_ns": "",
                                     "checkpoint_id": target}}
            cas.put_writes(conf, w, task)
            ref.put_writes(conf, w, task)
        cp = empty_checkpoint()
        cp["id"] = lg
        cp["channel_values"] = {"v": n}
        parent = rnd.choice(put) if put and rnd.random() < 0.9 else None
        conf = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        if parent:
            conf["configurable"]["checkpoint_id"] = parent
        meta: Any = {"step": n, "source": "loop", "parents": {}, "k": n % 3}
        cas.put(conf, cp, meta, {})
        ref.put(conf, cp, meta, {})
        put.append(lg)
        assert _plain(cas.get_tuple(cfg(thread))) == _plain(ref.get_tuple(cfg(thread)))
        for k in (1, 3, 7):
            assert ([_plain(t) for t in cas.list(cfg(thread), limit=k)]
                    == [_plain(t) for t in ref.list(cfg(thread), limit=k)])
        pick = rnd.choice(ids)
        one = {"configurable": {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": pick}}
        assert _plain(cas.get_tuple(one)) == _plain(ref.get_tuple(one))
        assert ([_plain(t) for t in cas.list(cfg(thread), before=one, limit=2)]
                == [_plain(t) for t in ref.list(cfg(thread), before=one, limit=2)])
        assert ([_plain(t) for t in cas.list(cfg(thread), filter={"k": 1}, limit=3)]
                == [_plain(t) for t in ref.list(cfg(thread), filter={"k": 1}, limit=3)])


def _full(saver: CasSaver, thread: str) -> Any:
    """The latest checkpoint and list() by a walk of the whole log, as before the bounds."""
    every = saver.store.history(f'lg:["{thread}",""]')
    cps = [e for e in every if "lg" in e.metadata]
    best = max(cps, key=lambda e: str(e.metadata["lg"]))
    return best.metadata["lg"], sorted((str(e.metadata["lg"]) for e in cps), reverse=True)


def test_deleting_the_greatest_leaves_an_upper_bound_that_still_reads_exactly() -> None:
    """delete_for_runs removes the run that put the greatest id: the later entries' bound
    overstates, and the reads still find the greatest remaining one."""
    saver = CasSaver.from_url(f"memory://o1d-{uuid.uuid4().hex[:8]}")
    rnd = random.Random(7)
    ids = _ids(rnd, 12)
    order = ids[:6] + [ids[-1]] + ids[6:11]  # the greatest put 7th, by run "gone"
    conf: RunnableConfig = {"configurable": {"thread_id": "d", "checkpoint_ns": ""}}
    for n, lg in enumerate(order):
        cp = empty_checkpoint()
        cp["id"] = lg
        run = "gone" if lg == ids[-1] else f"r{n}"
        saver.put(conf, cp, {"step": n, "source": "loop", "parents": {}, "run_id": run}, {})
    saver.delete_for_runs(["gone"])
    latest, listed = _full(saver, "d")
    tup = saver.get_tuple(cfg("d"))
    assert tup is not None and tup.config["configurable"]["checkpoint_id"] == latest == ids[10]
    assert [t.config["configurable"]["checkpoint_id"] for t in saver.list(cfg("d"), limit=4)
            ] == listed[:4]


def test_a_thread_written_before_the_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries without lgm/lge (an older CasSaver): read by a full walk, the same answers;
    the first put records the bound, and from then on a get_tuple reads a few entries."""
    saver = CasSaver.from_url(f"memory://o1l-{uuid.uuid4().hex[:8]}")
    graph = agent(saver)
    prepare = Core.prepare

    def old_prepare(self: Core, *a: Any, check: Any = None, **kw: Any) -> Any:
        return prepare(self, *a, **kw)  # no check: entries as an older CasSaver wrote them

    with monkeypatch.context() as m:
        m.setattr(Core, "prepare", old_prepare)
        for turn in range(6):
            graph.invoke({"messages": [HumanMessage(f"q{turn}", id=f"h{turn}")]}, cfg("l"))
        before = graph.get_state(cfg("l"))
        listed = [t.config for t in saver.list(cfg("l"), limit=5)]
    every = saver.store.history('lg:["l",""]')
    assert not any("lgm" in e.metadata for e in every)
    assert graph.get_state(cfg("l")) == before  # the same answers from a full walk
    assert [t.config for t in saver.list(cfg("l"), limit=5)] == listed
    graph.invoke({"messages": [HumanMessage("q6", id="h6")]}, cfg("l"))
    after = graph.get_state(cfg("l"))
    assert len(after.values["messages"]) == 7 * 5  # human, call, 2 results, answer
    assert any("lgm" in e.metadata for e in saver.store.history('lg:["l",""]', limit=10))
    walked = RefStore.iter_newest_first
    count = [0]

    def counting(self: RefStore, head: Head, view: Any) -> Iterator[LogEntry]:
        for entry in walked(self, head, view):
            count[0] += 1
            yield entry

    monkeypatch.setattr(RefStore, "iter_newest_first", counting)
    assert saver.get_tuple(cfg("l")) is not None
    assert count[0] <= 8  # was the whole log (24 entries before the put)


class DeltaState(TypedDict):
    messages: Annotated[list[Any], DeltaChannel(_messages_delta_reducer, snapshot_frequency=4)]


def test_the_delta_channel_walk_reads_back_to_the_snapshot(counted: type[Reads]) -> None:
    """get_delta_channel_history reads the log back to the channel's snapshot, not the whole
    log: the same entries at turn 8 and turn 200 (the same place in the snapshot cycle)."""
    saver = CasSaver.from_url(f"memory://o1delta-{uuid.uuid4().hex[:8]}")
    b = StateGraph(DeltaState)
    b.add_node("model", lambda s: {"messages": [AIMessage("hi", id=f"a{len(s['messages'])}")]})
    b.add_edge(START, "model")
    graph = b.compile(checkpointer=saver)
    reads = {}
    for turn in range(1, 201):
        graph.invoke({"messages": [HumanMessage("q", id=f"h{turn}")]}, cfg("d"))
        if turn in (8, 200):
            Reads.take()
            got = saver.get_delta_channel_history(config=cfg("d"), channels=["messages"])
            reads[turn] = Reads.take()[0]
            assert "seed" in got["messages"] or got["messages"]["writes"]
    assert len(graph.get_state(cfg("d")).values["messages"]) == 400
    # (LangGraph's pool of threads lands a step's writes in either order: an entry either way)
    assert abs(reads[8] - reads[200]) <= 1 and max(reads.values()) <= 40, reads
