"""CasSaver as a drop-in for LangGraph's own savers (issue 28): what LangGraph itself writes
round-trips (metadata tuples, str subclasses, node errors, other savers' channel versions,
the classes of a graph's own schemas), and prune does what LangGraph documents. Each test runs
on a local folder and on memory://."""

import operator
import uuid
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import START, StateGraph
from langgraph.graph.message import _messages_delta_reducer
from typing_extensions import TypedDict

from cas_checkpoint import CasError
from cas_checkpoint.integrations.langgraph import CasSaver

KINDS = ["local", "memory"]


@pytest.fixture(params=KINDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "store")
    return f"memory://lgcompat-{uuid.uuid4().hex}"


def _config(thread: str = "t") -> Any:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


# --- A: what LangGraph writes into CheckpointMetadata --------------------------------------


class DeltaState(TypedDict):
    messages: Annotated[list, DeltaChannel(_messages_delta_reducer, snapshot_frequency=3)]
    count: Annotated[int, operator.add]


def test_delta_channel_metadata_tuples_round_trip(url: str) -> None:
    saver = CasSaver.from_url(url)
    builder = StateGraph(DeltaState)
    builder.add_node("model", lambda s: {"messages": [AIMessage("hi", id=f"a{s['count']}")],
                                         "count": 1})
    builder.add_edge(START, "model")
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "delta"}}
    for n in range(4):
        graph.invoke({"messages": [HumanMessage("q", id=f"h{n}")], "count": 0}, config)
    state = graph.get_state(config)
    assert len(state.values["messages"]) == 8
    counters = state.metadata["counters_since_delta_snapshot"]
    assert counters and all(type(v) is tuple and len(v) == 2 for v in counters.values())
    # a new saver object (nothing cached) reads the same
    again = builder.compile(checkpointer=CasSaver.from_url(url)).get_state(config)
    assert again.metadata == state.metadata and again.values == state.values


def test_metadata_tuples_become_declared_types_and_the_rest_json(url: str) -> None:
    saver = CasSaver.from_url(url)
    meta: Any = {"source": "loop", "step": 1, "parents": {},
                 "counters_since_delta_snapshot": {"messages": (0, 1)},
                 "user": ("a", ["b", ("c",)])}
    saver.put(_config(), empty_checkpoint(), meta, {})
    got = saver.get_tuple(_config())
    assert got is not None
    assert got.metadata["counters_since_delta_snapshot"] == {"messages": (0, 1)}
    assert got.metadata["user"] == ["a", ["b", ["c"]]]  # user metadata is JSON-like


def test_metadata_a_reader_refuses_is_refused_on_put(url: str) -> None:
    saver = CasSaver.from_url(url)
    for bad in ({"x": {1, 2}}, {"x": object()}, {"x": b"\x00" * 5_000_000}):
        with pytest.raises(CasError) as info:
            saver.put(_config(), empty_checkpoint(), {"source": "loop", **bad}, {})
        assert "metadata" in str(info.value)
    assert saver.get_tuple(_config()) is None  # nothing was written
    assert list(saver.list(None)) == []


# --- B: str subclasses (langchain-core's TextAccessor) -------------------------------------


class AnyOut(TypedDict, total=False):
    result: Any
    count: Annotated[int, operator.add]


def _one_node(saver: CasSaver, fn: Any, **compile_kw: Any) -> Any:
    builder = StateGraph(AnyOut)
    builder.add_node("node", fn)
    builder.add_edge(START, "node")
    return builder.compile(checkpointer=saver, **compile_kw)


def test_a_str_subclass_is_stored_as_str(url: str) -> None:
    text = AIMessage("the answer").text
    assert type(text) is not str and isinstance(text, str)  # langchain-core's TextAccessor
    graph = _one_node(CasSaver.from_url(url), lambda s: {"result": text, "count": 1})
    config = {"configurable": {"thread_id": "b"}}
    assert graph.invoke({"count": 0}, config)["result"] == "the answer"
    got = _one_node(CasSaver.from_url(url), lambda s: {}).get_state(config).values["result"]
    assert got == "the answer" and type(got) is str


# --- D: a node's error, as LangGraph's serializer stores it ---------------------------------


class Loud(Exception):
    def __repr__(self) -> str:  # never called by the saver
        raise AssertionError("the error's own __repr__ ran")


@pytest.mark.parametrize("error, text", [
    (ValueError("Input is too large"), "ValueError('Input is too large')"),
    (Loud("boom", 3, None), "Loud('boom', 3, None)"),
    (KeyError(object()), "KeyError(<object>)"),
    (RuntimeError(), "RuntimeError()"),
])
def test_a_node_error_is_stored_as_its_text(url: str, error: Exception, text: str) -> None:
    def fail(state: Any) -> Any:
        raise error

    saver = CasSaver.from_url(url)
    graph = _one_node(saver, fail)
    config = {"configurable": {"thread_id": "d"}}
    with pytest.raises(type(error)):
        graph.invoke({"count": 0}, config)
    fresh = CasSaver.from_url(url)
    tup = fresh.get_tuple(config)
    assert tup is not None
    assert [(w[1], w[2]) for w in tup.pending_writes] == [("__error__", text)]
    assert _one_node(fresh, fail).get_state(config).tasks[0].error == text


# --- E: classes nobody registered -----------------------------------------------------------


def test_a_graph_schema_class_defined_in_a_function_comes_back_as_itself(url: str) -> None:
    from pydantic import BaseModel

    class Inner(BaseModel):
        n: int

    class State(BaseModel):
        items: list[Inner] = []
        note: str = ""

    def build(saver: CasSaver) -> Any:
        builder = StateGraph(State)
        builder.add_node("add", lambda s: {"items": [*s.items, Inner(n=len(s.items))]})
        builder.add_edge(START, "add")
        return builder.compile(checkpointer=saver)

    config = {"configurable": {"thread_id": "e"}}
    for unregistered in ("data", "raise"):  # schema classes need no configuration in either
        thread = {"configurable": {"thread_id": f"e-{unregistered}"}}
        build(CasSaver.from_url(url, unregistered=unregistered)).invoke(State(), thread)
        fresh = build(CasSaver.from_url(url, unregistered=unregistered))
        items = fresh.get_state(thread).values["items"]
        assert items == [Inner(n=0)] and type(items[0]) is Inner
    # a saver that never saw the graph reads the data (as LangGraph's strict mode does)
    build(CasSaver.from_url(url)).invoke(State(), config)
    tup = CasSaver.from_url(url).get_tuple(config)
    assert tup is not None and tup.checkpoint["channel_values"]["items"] == [{"n": 0}]


def test_a_second_graph_of_the_same_schemas_reads_no_type_hints(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The saver learns the classes of each graph that calls it (schemas.py); a graph built
    again of the same schemas (each test of a suite, each request of a server) reads no type
    hints again (old code: the whole walk per graph, ~1 ms of typing.get_type_hints for
    MessagesState; LangGraph's test files build a graph or more per test). A new class is
    still learned."""
    from pydantic import BaseModel

    from cas_checkpoint.integrations.langgraph import schemas

    class Note(BaseModel):
        text: str

    class State(TypedDict):
        messages: Annotated[list, operator.add]
        notes: Annotated[list[Note], operator.add]

    def build(saver: CasSaver, state: Any = State) -> Any:
        builder = StateGraph(state)
        builder.add_node("n", lambda s: {"messages": [AIMessage("hi")],
                                         "notes": [Note(text="x")]})
        builder.add_edge(START, "n")
        return builder.compile(checkpointer=saver)

    read: list[Any] = []
    real = schemas.typing.get_type_hints

    def counted(obj: Any, *a: Any, **kw: Any) -> Any:
        read.append(obj)
        return real(obj, *a, **kw)
    monkeypatch.setattr(schemas.typing, "get_type_hints", counted)
    saver = CasSaver.from_url(f"memory://lgschemas-{uuid.uuid4().hex}")
    config = _config("s")
    build(saver).invoke({"messages": [HumanMessage("go")]}, config)
    assert Note in read  # the first graph's classes are read
    assert saver.get_tuple(config) is not None and Note in saver._core.types
    read.clear()
    for i in range(3):
        graph = build(CasSaver.from_url(f"memory://lgschemas-{uuid.uuid4().hex}"))
        graph.invoke({"messages": [HumanMessage("go")]}, _config(f"s{i}"))
        assert graph.get_state(_config(f"s{i}")).values["notes"] == [Note(text="x")]
    assert read == []

    class Other(BaseModel):  # a new class: learned (its hints read once)
        text: str

    class State2(TypedDict):
        notes: Annotated[list[Other], operator.add]

    builder = StateGraph(State2)
    builder.add_node("n", lambda s: {"notes": [Other(text="y")]})
    builder.add_edge(START, "n")
    other = CasSaver.from_url(f"memory://lgschemas-{uuid.uuid4().hex}")
    builder.compile(checkpointer=other).invoke({"notes": []}, _config("o"))
    assert Other in read and Other in other._core.types


def test_a_new_saver_reading_a_graph_builds_no_schema_model(
        url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new saver learns the calling graph's classes from what the graph holds: reading its
    computed ``input_schema``/``output_schema`` built a new pydantic model each time (~0.3 ms
    of a 2 ms latest-state read through a new saver; old code: 2 a read), and for a state of
    ``typing.TypedDict`` it raised (pydantic refuses those on Python < 3.12), so such a graph's
    classes were not learned at all."""
    import typing

    from langgraph.pregel import Pregel
    from pydantic import BaseModel

    from cas_checkpoint.integrations.langgraph import schemas

    class Note(BaseModel):
        text: str

    class State(typing.TypedDict):  # (not typing_extensions')
        messages: Annotated[list, operator.add]
        notes: Annotated[list[Note], operator.add]

    builder = StateGraph(State)
    builder.add_node("n", lambda s: {"messages": [AIMessage("hi")], "notes": [Note(text="x")]})
    builder.add_edge(START, "n")
    graph = builder.compile(checkpointer=CasSaver.from_url(url))
    config = _config("m")
    graph.invoke({"messages": [HumanMessage("go")], "notes": []}, config)
    assert Note in schemas.classes_of(schemas.graph_roots(graph))
    made: list[str] = []
    for name in ("get_input_schema", "get_output_schema"):
        real = getattr(Pregel, name)

        def counted(self: Any, *a: Any, real: Any = real, name: str = name, **kw: Any) -> Any:
            made.append(name)
            return real(self, *a, **kw)
        monkeypatch.setattr(Pregel, name, counted)
    for _ in range(3):  # a copy of the graph and a new saver per request
        saver = CasSaver.from_url(url)
        values = graph.copy(update={"checkpointer": saver}).get_state(config).values
        assert values["notes"] == [Note(text="x")] and Note in saver._core.types
    assert made == []


def test_a_new_saver_per_request_parses_and_hashes_nothing_again(
        url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that makes a new saver per request (or per conversation) over one store:
    each reads the ref and the packs from storage again, and compares them with the bytes
    this process parsed and hashed before (process_caches.py), so nothing is parsed, decoded
    or hashed again. Old code, local disk: every new saver parsed (and hashed) the thread's
    packs, decoded its head and joined its state again (here 4 packs parsed, 1 head decoded,
    1 state joined and 50 objects hashed a read)."""
    from cas_checkpoint.engine import pack_reads
    from cas_checkpoint.engine.object_store import ObjectStore
    from cas_checkpoint.format.heads import Head
    from cas_checkpoint.tree import build as tree

    class State(TypedDict):
        messages: Annotated[list, operator.add]

    builder = StateGraph(State)
    builder.add_node("n", lambda s: {"messages": [AIMessage("hi " * 200)]})
    builder.add_edge(START, "n")
    graph = builder.compile(checkpointer=CasSaver.from_url(url))
    config = _config("r")
    for i in range(30):
        graph.invoke({"messages": [HumanMessage(f"go {i} " * 100)]}, config)
    counts = {"packs parsed": 0, "heads decoded": 0, "states joined": 0, "objects hashed": 0}

    def counting(name: str, real: Any) -> Any:
        def counted(*a: Any, **kw: Any) -> Any:
            counts[name] += 1
            return real(*a, **kw)
        return counted
    monkeypatch.setattr(ObjectStore, "parse", counting("packs parsed", ObjectStore.parse))
    monkeypatch.setattr(Head, "decode", staticmethod(counting("heads decoded", Head.decode)))
    monkeypatch.setattr(tree, "load", counting("states joined", tree.load))
    monkeypatch.setattr(pack_reads, "object_id",
                        counting("objects hashed", pack_reads.object_id))
    real_ids = pack_reads.object_ids
    monkeypatch.setattr(pack_reads, "object_ids", lambda views: (
        counts.__setitem__("objects hashed", counts["objects hashed"] + len(views))
        or real_ids(views)))
    for _ in range(3):
        saver = CasSaver.from_url(url)
        tup = saver.get_tuple(config)
        assert tup is not None and len(tup.checkpoint["channel_values"]["messages"]) == 60
    assert counts == dict.fromkeys(counts, 0)


def test_a_class_outside_the_schemas_is_stored_as_data(url: str) -> None:
    from dataclasses import dataclass

    @dataclass
    class Decision:
        ok: bool

    graph = _one_node(CasSaver.from_url(url), lambda s: {"result": Decision(ok=True)})
    config = {"configurable": {"thread_id": "data"}}
    assert graph.invoke({"count": 0}, config)["result"] == Decision(ok=True)
    assert graph.get_state(config).values["result"] == {"ok": True}  # not rebuilt
    typed = _one_node(CasSaver.from_url(url, types=[Decision]), lambda s: {})
    assert typed.get_state(config).values["result"] == Decision(ok=True)
    strict = _one_node(CasSaver.from_url(url, unregistered="raise"),
                       lambda s: {"result": Decision(ok=True)})
    with pytest.raises(CasError) as info:
        strict.invoke({"count": 0}, {"configurable": {"thread_id": "refused"}})
    assert "types=[Decision]" in str(info.value)


def test_a_stored_class_name_is_never_imported(url: str) -> None:
    import sys

    from cas_checkpoint.format.extypes import ObjectData

    saver = CasSaver.from_url(url)
    cp = empty_checkpoint()
    cp["channel_values"] = {"x": ObjectData("cas_never_imported_mod.Evil", {"a": 1})}
    saver.put(_config(), cp, {"source": "loop"}, {})
    tup = CasSaver.from_url(url).get_tuple(_config())
    assert tup is not None and tup.checkpoint["channel_values"]["x"] == {"a": 1}
    assert "cas_never_imported_mod" not in sys.modules


def test_an_object_of_no_storable_kind_is_refused_naming_where(url: str) -> None:
    graph = _one_node(CasSaver.from_url(url), lambda s: {"result": lambda: 1})
    with pytest.raises(CasError) as info:
        graph.invoke({"count": 0}, {"configurable": {"thread_id": "fn"}})
    assert "function" in str(info.value)


# --- C: threads whose channel versions another saver wrote ----------------------------------


class Steps(TypedDict, total=False):
    value: Annotated[int, operator.add]
    trail: Annotated[list, operator.add]


def _steps_graph(saver: Any) -> Any:
    builder = StateGraph(Steps)
    builder.add_node("a", lambda s: {"value": 1, "trail": ["a"]})
    builder.add_node("b", lambda s: {"value": 10, "trail": ["b"]})
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    return builder.compile(checkpointer=saver, interrupt_before=["b"])


def _copy_thread(source: Any, target: CasSaver, thread: str) -> None:
    """Every checkpoint and pending write of ``thread``, oldest first, through the public
    saver API only."""
    for tup in reversed(list(source.list({"configurable": {"thread_id": thread}}))):
        ns = tup.config["configurable"]["checkpoint_ns"]
        parent = tup.parent_config or {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
        target.put(parent, tup.checkpoint, tup.metadata, tup.checkpoint["channel_versions"])
        by_task: dict[str, list[tuple[str, Any]]] = {}
        for task_id, channel, value in tup.pending_writes or []:
            by_task.setdefault(task_id, []).append((channel, value))
        for task_id, writes in by_task.items():
            target.put_writes(tup.config, writes, task_id)


def _other_savers() -> list[Any]:
    import sqlite3

    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.sqlite import SqliteSaver

    return [InMemorySaver(), SqliteSaver(sqlite3.connect(":memory:", check_same_thread=False))]


@pytest.mark.parametrize("source", range(2), ids=["InMemorySaver", "SqliteSaver"])
def test_a_thread_from_another_saver_resumes(url: str, source: int) -> None:
    other = _other_savers()[source]
    config = {"configurable": {"thread_id": "moved"}}
    _steps_graph(other).invoke({"value": 0, "trail": []}, config)  # stops before b
    before = other.get_tuple(config)
    assert before is not None
    versions = before.checkpoint["channel_versions"]
    assert versions and all(type(v) is str for v in versions.values())  # "000...02.0.123"
    saver = CasSaver.from_url(url)
    _copy_thread(other, saver, "moved")
    graph = _steps_graph(saver)
    assert graph.get_state(config).next == ("b",)
    assert graph.invoke(None, config) == {"value": 11, "trail": ["a", "b"]}
    after = saver.get_tuple(config)
    assert after is not None
    new = after.checkpoint["channel_versions"]
    assert all(type(v) is str and len(v.split(".")[0]) == 32 for v in new.values())
    assert max(new.values()) > max(versions.values())  # numbering continues
    assert new["value"] > versions["value"]


def test_versions_of_each_format_increase() -> None:
    saver = CasSaver.from_url(f"memory://lgcompat-{uuid.uuid4().hex}")
    assert saver.get_next_version(None, None) == 1
    assert saver.get_next_version(7, None) == 8  # this saver's own
    assert saver.get_next_version(2.0, None) == 3.0
    for other in _other_savers():  # what they write, continued
        v = other.get_next_version(other.get_next_version(None, None), None)
        nxt = saver.get_next_version(v, None)
        assert type(nxt) is str and nxt > v and nxt.split(".")[0] == f"{3:032}"
        assert other.get_next_version(nxt, None) > nxt  # and they can continue ours
    with pytest.raises(CasError) as info:
        saver.get_next_version("v2", None)
    assert "channel version" in str(info.value)


# --- prune: LangGraph's strategies, per namespace --------------------------------------------


def _agent(saver: CasSaver) -> Any:
    """A tool-calling agent: the model asks for two tools (one answered inside a subgraph
    with its own checkpointer), then a human approves with interrupt()."""
    from langchain_core.messages import ToolMessage
    from langgraph.graph import END, MessagesState
    from langgraph.types import interrupt

    def tool_node(state: MessagesState) -> Any:
        call = state["messages"][-1].tool_calls[0]
        return {"messages": [ToolMessage(f"result {call['args']['n']}", tool_call_id=call["id"],
                                         id=f"t{call['args']['n']}")]}

    sub = StateGraph(MessagesState)
    sub.add_node("run", tool_node)
    sub.add_edge(START, "run")
    tools = sub.compile(checkpointer=True)  # keeps its own namespace's checkpoints

    def model(state: MessagesState) -> Any:
        n = sum(1 for m in state["messages"] if m.type == "tool")
        if n < 2:
            return {"messages": [AIMessage("", id=f"ai{n}", tool_calls=[
                {"name": "search", "args": {"n": n}, "id": f"call{n}"}])]}
        return {"messages": [AIMessage("done", id="final")]}

    def approve(state: MessagesState) -> Any:
        answer = interrupt("approve?")
        return {"messages": [HumanMessage(str(answer), id="approval")]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", tools)
    builder.add_node("approve", approve)
    builder.add_edge(START, "model")
    builder.add_conditional_edges(
        "model", lambda s: "tools" if s["messages"][-1].tool_calls else "approve")
    builder.add_edge("tools", "model")
    builder.add_edge("approve", END)
    return builder.compile(checkpointer=saver)


def _namespaces(saver: CasSaver, thread: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for tup in saver.list({"configurable": {"thread_id": thread}}):
        ns = tup.config["configurable"]["checkpoint_ns"]
        counts[ns] = counts.get(ns, 0) + 1
    return counts


def test_keep_latest_keeps_one_checkpoint_per_namespace_and_the_thread_resumes(url: str) -> None:
    from langgraph.types import Command

    saver = CasSaver.from_url(url)
    graph = _agent(saver)
    for thread in ("pruned", "twin"):
        graph.invoke({"messages": [HumanMessage("go", id="h")]},
                     {"configurable": {"thread_id": thread}})
    pruned = {"configurable": {"thread_id": "pruned"}}
    before = graph.get_state(pruned)
    assert before.interrupts and before.next == ("approve",)  # a pending interrupt write
    counts = _namespaces(saver, "pruned")
    assert len(counts) >= 2 and counts[""] > 5  # the root and the subgraph's namespace
    saver.prune(["pruned"], strategy="keep_latest")
    assert _namespaces(saver, "pruned") == {ns: 1 for ns in counts}
    assert _namespaces(saver, "twin") == counts  # other threads untouched
    fresh = _agent(CasSaver.from_url(url))
    after = fresh.get_state(pruned)
    assert after.values == before.values and after.next == before.next
    assert after.interrupts == before.interrupts and after.parent_config is None
    done = fresh.invoke(Command(resume="yes"), pruned)
    twin = fresh.invoke(Command(resume="yes"), {"configurable": {"thread_id": "twin"}})
    assert done == twin and done["messages"][-1].content == "yes"


def test_keep_latest_on_a_one_node_graph_keeps_one(url: str) -> None:
    saver = CasSaver.from_url(url)
    graph = _one_node(saver, lambda s: {"result": "x", "count": 1})
    config = {"configurable": {"thread_id": "one"}}
    for _ in range(3):
        graph.invoke({"count": 0}, config)
    assert _namespaces(saver, "one") == {"": 9}
    values = graph.get_state(config).values
    saver.prune(["one"])
    assert _namespaces(saver, "one") == {"": 1}
    assert graph.get_state(config).values == values


def test_keep_latest_keeps_a_delta_channel_rebuildable(url: str) -> None:
    saver = CasSaver.from_url(url)
    builder = StateGraph(DeltaState)
    builder.add_node("model", lambda s: {"messages": [AIMessage("hi", id=f"a{s['count']}")],
                                         "count": 1})
    builder.add_edge(START, "model")
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "delta"}}
    for n in range(5):
        graph.invoke({"messages": [HumanMessage("q", id=f"h{n}")], "count": 0}, config)
    values = graph.get_state(config).values
    total = _namespaces(saver, "delta")[""]
    saver.prune(["delta"])
    kept = _namespaces(saver, "delta")[""]
    assert 1 <= kept < total
    fresh = builder.compile(checkpointer=CasSaver.from_url(url)).get_state(config)
    assert fresh.values == values and len(values["messages"]) == 10


def test_aprune_and_delete(url: str) -> None:
    import asyncio

    saver = CasSaver.from_url(url)
    graph = _one_node(saver, lambda s: {"result": "x", "count": 1})

    async def main() -> None:
        for thread in ("a", "b"):
            await graph.ainvoke({"count": 0}, {"configurable": {"thread_id": thread}})
        await saver.aprune(["a"], strategy="keep_latest")
        assert _namespaces(saver, "a") == {"": 1}
        await saver.aprune(["a", "b"], strategy="delete")

    asyncio.run(main())
    assert list(saver.list(None)) == []
    with pytest.raises(CasError):
        saver.prune(["a"], strategy="keep_first")
