"""The CPU of one put / put_writes commit (issue 29: memory:// saves): a save does not decode,
validate or walk again what this process has itself just encoded. Counted per turn of a
tool-calling agent (LangGraph's async API, as a production agent runs it) on memory://, at
turn 10 and turn 40: the same, and none of that work. Reads keep every check: a log segment
is still read and hashed, and bytes this process did not encode are decoded as before."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict, cast

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Send

from cas_checkpoint import CheckpointStore
from cas_checkpoint.engine import model, refs
from cas_checkpoint.errors import FormatError
from cas_checkpoint.format import codec
from cas_checkpoint.format.objects import ObjectId, Segment
from cas_checkpoint.integrations.langgraph import CasSaver
from cas_checkpoint.integrations.langgraph import encode as lg_encode
from cas_checkpoint.integrations.langgraph.registry import saver_registry


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def agent(saver: Any) -> Any:
    """A human message makes the model call two tools (concurrent tasks, each its own pending
    writes), then the model answers: 10 log entries a turn."""

    def llm(state: State) -> dict[str, Any]:
        n = len(state["messages"])
        if isinstance(state["messages"][-1], HumanMessage):
            calls = [{"name": "lookup", "args": {"i": k}, "id": f"c{n}-{k}", "type": "tool_call"}
                     for k in range(2)]
            return {"messages": [AIMessage("", tool_calls=calls, id=f"ai{n}")]}
        return {"messages": [AIMessage(f"answer {n} " + "x" * 200, id=f"ai{n}")]}

    def route(state: State) -> Any:
        last = state["messages"][-1]
        if isinstance(last, AIMessage) and last.tool_calls:
            return [Send("tool", call) for call in last.tool_calls]
        return END

    def tool(call: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [ToolMessage(f"result {call['args']['i']}", tool_call_id=call["id"],
                                         id=f"t-{call['id']}")]}

    b = StateGraph(State)
    b.add_node("model", llm)
    b.add_node("tool", cast(Any, tool))
    b.add_edge(START, "model")
    b.add_conditional_edges("model", route, ["tool", END])
    b.add_edge("tool", "model")
    return b.compile(checkpointer=saver)


WORK = Counter[str]()
IN_SAVE = 0  # puts and put_writes running now (the turn's get_tuple is not counted)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts, inside aput / aput_writes: log segments decoded, metadata walked in Python
    (``model._meta_problem``), and round trips the put encoder tried (``_round_trips``)."""
    decode, walk = Segment.decode, model._meta_problem
    trips = lg_encode.PutEncoder._round_trips

    def seg_decode(data: Any) -> Segment:
        WORK["segments decoded"] += IN_SAVE > 0
        return decode(data)

    def meta_walk(meta: Any) -> Any:
        WORK["metadata walked"] += IN_SAVE > 0
        return walk(meta)

    def round_trip(*a: Any, **k: Any) -> Any:
        WORK["round trips"] += IN_SAVE > 0
        return trips(*a, **k)

    def counting(name: str) -> Any:
        real = getattr(CasSaver, name)

        async def call(self: CasSaver, *a: Any, **k: Any) -> Any:
            global IN_SAVE
            IN_SAVE += 1
            WORK["calls"] += 1
            try:
                return await real(self, *a, **k)
            finally:
                IN_SAVE -= 1
        return call

    monkeypatch.setattr(Segment, "decode", staticmethod(seg_decode))
    monkeypatch.setattr(model, "_meta_problem", meta_walk)
    monkeypatch.setattr(lg_encode.PutEncoder, "_round_trips", round_trip)
    for name in ("aput", "aput_writes"):
        monkeypatch.setattr(CasSaver, name, counting(name))
    WORK.clear()
    yield WORK


def cfg(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id}}


def test_a_save_redoes_none_of_its_own_work_at_turn_10_and_40(counted: Counter[str]) -> None:
    """On the old code each turn's saves decoded 2-3 of the log's segments the writer had just
    made (32-48 entries validated again), walked each put's and put_writes' metadata in Python
    (15 walks a turn) and decoded each put's new messages to try their round trip (5 a turn)."""
    saver = CasSaver.from_url(f"memory://percall-{uuid.uuid4().hex[:8]}")
    graph = agent(saver)

    async def turns() -> dict[int, Counter[str]]:
        got = {}
        for turn in range(1, 43):
            counted.clear()
            await graph.ainvoke({"messages": [HumanMessage(f"question {turn}", id=f"h{turn}")]},
                                cfg("t"))
            if turn in (10, 11, 12, 40, 41, 42):
                got[turn] = counted.copy()
        return got

    got = asyncio.run(turns())
    for turn, work in got.items():
        assert work["calls"] == 10, (turn, work)  # 5 puts and 5 put_writes
        assert work["segments decoded"] == 0, (turn, work)
        assert work["metadata walked"] == 0, (turn, work)
        assert work["round trips"] == 0, (turn, work)
    state = asyncio.run(graph.aget_state(cfg("t")))
    assert len(state.values["messages"]) == 42 * 5
    # a new saver (new caches) reads back the same
    again = agent(CasSaver.from_url(saver.store.url))
    assert asyncio.run(again.aget_state(cfg("t"))).values == state.values


def test_round_trips_are_tried_at_the_load_that_reuses_the_items(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A put tries no round trip; the next turn's get_tuple tries the new items' round trip
    once (one encoding of them all), and a later put reuses them (nothing encoded again)."""
    saver = CasSaver.from_url(f"memory://percall-{uuid.uuid4().hex[:8]}")
    graph = agent(saver)
    decoded: list[int] = []
    real = lg_encode.PutEncoder._round_trips

    def trips(self: Any, objects: list[Any], data: bytes, start: int, ends: list[int],
              types: Any) -> list[bool]:
        decoded.append(len(ends))
        return real(self, objects, data, start, ends, types)

    monkeypatch.setattr(lg_encode.PutEncoder, "_round_trips", trips)
    for turn in range(1, 6):
        asyncio.run(graph.ainvoke(
            {"messages": [HumanMessage(f"question {turn}", id=f"h{turn}")]}, cfg("t")))
    # turn 1 loads nothing; each later turn's load tries the 5 messages the turn before
    # added (its input, the tool call, the two results, the answer), in one encoding
    assert decoded == [5, 5, 5, 5], decoded
    enc = saver._encoder
    assert enc.reused > enc.encoded


def test_a_segment_this_process_did_not_make_is_decoded_and_checked() -> None:
    """The segments a writer remembers are named by the hash of their bytes: a read still
    reads and hashes them, and bytes of another id (a segment this process did not encode)
    are decoded and checked as before: damaged bytes raise a FormatError."""
    store = CheckpointStore.open(f"memory://percall-{uuid.uuid4().hex[:8]}")
    for i in range(40):
        store.save("t", {"i": i})
    head = store._core.refs._decoded  # (the heads this process wrote)
    assert head
    bad = Segment(0, entries=()).encode()[:-1] + b"\xc1"  # not msgpack
    with pytest.raises(FormatError):
        refs.segment(ObjectId("0" * 64), bad)
    made = next(iter(refs._BUILT.items()))
    assert refs.segment(made[0], b"") is made[1]  # (its bytes were hashed by the view)
    assert [c.metadata for c in store.history("t")] == [{}] * 40


def test_an_append_indexes_only_its_new_messages() -> None:
    """A put of an appended messages list looks its new items up among the last put's by
    identity (an item moved there reuses its bytes): the index of ids is built once for the
    list and grown by each append's new items, not built again over every message each put
    (old code: no index kept, one built over the whole list each put). Its bytes stay a fresh
    encoding's."""
    types = saver_registry(objects=True)
    enc = lg_encode.PutEncoder()
    msgs: list[Any] = [HumanMessage(f"m{i}", id=f"m{i}") for i in range(3)]
    wheres = []
    for step in range(30):
        msgs = [*msgs, AIMessage(f"a{step}", id=f"a{step}")]
        cp = {"v": 4, "id": str(step), "channel_values": {"messages": msgs},
              "channel_versions": {"messages": step + 1}}
        got = enc.state("t", "", cp, {"messages": step + 1}, types)
        assert got.data == codec.encode(cp, types=types)
        wheres.append(enc._threads[("t", "")].values["messages"].where)
    # built at the second put (the first has nothing to look up in), then the same one grown
    assert wheres[1] is not None and all(w is wheres[1] for w in wheres[1:])
    assert wheres[-1] is not None and len(wheres[-1]) == len(msgs) == 33
