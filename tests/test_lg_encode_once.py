"""A CasSaver put encodes only what changed (issue 29): the objects encoded per put of a real
tool-calling loop are the same at turn 10 and turn 300, and what the saver builds from the
encodings it kept is byte for byte a fresh encoding of the checkpoint (random sequences of
puts, loads in between, registry changes, nesting at the codec's limit), in bounded memory."""

from __future__ import annotations

import copy
import random
import threading
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
)
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from pydantic import BaseModel

from cas_checkpoint.errors import SerializationError
from cas_checkpoint.format import codec, decoding
from cas_checkpoint.integrations.langgraph import CasSaver
from cas_checkpoint.integrations.langgraph import encode as encode_mod
from cas_checkpoint.integrations.langgraph.encode import PutEncoder
from cas_checkpoint.integrations.langgraph.registry import saver_registry
from cas_checkpoint.tree import build as tree

# --- a real tool-calling loop -----------------------------------------------------------------


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    calls: int


def _agent(s: Any) -> dict[str, Any]:
    last, n = s["messages"][-1], len(s["messages"])
    if isinstance(last, HumanMessage):
        call = {"name": "search", "args": {"q": f"query {n}"}, "id": f"call{n}"}
        return {"messages": [AIMessage(content="", id=f"a{n}", tool_calls=[call])],
                "calls": s.get("calls", 0) + 1}
    return {"messages": [AIMessage(content=f"answer {n} " + "y" * 100, id=f"b{n}")],
            "calls": s.get("calls", 0) + 1}


def _tools(s: Any) -> dict[str, Any]:
    last = s["messages"][-1]
    assert isinstance(last, AIMessage)
    return {"messages": [ToolMessage(content="result " + "z" * 100, id=f"t{len(s['messages'])}",
                                     tool_call_id=last.tool_calls[0]["id"])]}


def _graph(saver: CasSaver) -> Any:
    g = StateGraph(State)
    g.add_node("agent", _agent)
    g.add_node("tools", _tools)
    g.add_edge(START, "agent")
    g.add_conditional_edges(
        "agent", lambda s: "tools" if getattr(s["messages"][-1], "tool_calls", None) else END,
        ["tools", END])
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=saver)


@pytest.mark.parametrize("where", ["memory", "local"])
def test_objects_encoded_per_put_are_the_same_at_turn_10_and_300(
        where: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each turn (an invoke: a get_tuple, then 5 puts) of a tool-calling loop adds 4 messages.
    Counted: the LangChain messages the codec encodes (``codec._reduce``, its Python path) in
    each put (a head's or record's tuples, whose number varies with the log's segments, are
    not counted). On the old code a put encoded every message of the thread again (37-40 at
    turn 10, 1,197-1,200 at turn 300)."""
    url = "memory://encode-once-" + where if where == "memory" else str(tmp_path / "store")
    saver = CasSaver.from_url(url)
    app = _graph(saver)
    counted = threading.local()  # (a put_writes of another thread may run meanwhile)
    reduce = codec._reduce

    def counting(obj: Any, reg: Any) -> Any:
        counted.n = getattr(counted, "n", 0) + isinstance(obj, BaseMessage)
        return reduce(obj, reg)

    monkeypatch.setattr(codec, "_reduce", counting)
    per_put: list[int] = []
    put = CasSaver.put

    def counted_put(self: CasSaver, *a: Any, **k: Any) -> Any:
        before = getattr(counted, "n", 0)
        try:
            return put(self, *a, **k)
        finally:
            per_put.append(counted.n - before)

    monkeypatch.setattr(CasSaver, "put", counted_put)
    cfg = {"configurable": {"thread_id": "loop"}}
    seen: dict[int, list[int]] = {}
    for turn in range(1, 301):
        per_put.clear()
        app.invoke({"messages": [HumanMessage(content=f"question {turn}", id=f"h{turn}")]},
                   cfg, durability="sync")
        if turn in (10, 300):
            seen[turn] = list(per_put)
    assert len(app.get_state(cfg).values["messages"]) == 1200
    assert len(seen[10]) == 5
    assert seen[300] == seen[10], seen
    # the input's message: in __start__, then in messages; a new message in messages is
    # encoded once: whether it round trips (decoded and encoded again) is tried at the next
    # turn's get_tuple, whose load would reuse it, not by the put (on the old code: [1, 2, 2,
    # 2, 2])
    assert seen[10] == [1, 1, 1, 1, 1]


# --- byte for byte a fresh encoding ---------------------------------------------------------


class Note(BaseModel):
    text: str
    tags: list[str] = []


REG = saver_registry(objects=True)
REG.register(Note)


def _message(rnd: random.Random, n: int) -> Any:
    kind = rnd.randrange(5)
    if kind == 0:
        return HumanMessage(content=f"h{n} " * rnd.randrange(1, 20), id=f"h{n}")
    if kind == 1:
        return AIMessage(content="", id=f"a{n}", tool_calls=[
            {"name": "f", "args": {"x": n, "t": (1, 2)}, "id": f"c{n}"}])
    if kind == 2:
        return ToolMessage(content=[{"type": "text", "text": f"r{n}"}], tool_call_id=f"c{n}",
                           id=f"t{n}")
    if kind == 3:
        return {"role": "user", "content": f"plain {n}", "n": n}
    return Note(text=f"note {n}", tags=["a"] * (n % 3))


def _fresh(checkpoint: dict[str, Any]) -> bytes:
    return codec.encode(dict(checkpoint), types=REG)


def _check(enc: PutEncoder, cp: dict[str, Any], new: dict[str, Any]) -> Any:
    got = enc.state("t", "", cp, new, REG)
    assert type(got) is tree.Encoded
    assert got.data == _fresh(cp)
    return got


@pytest.mark.parametrize("seed", range(12))
def test_random_puts_encode_byte_for_byte_as_a_fresh_encoding(seed: int) -> None:
    """LangGraph's way: an update makes a new list (add_messages) at a new version; the items
    kept are the same objects. Mixed in: removals, replacements, a kept message whose field is
    reassigned, an item moved, dict items, a channel left alone, a channel replaced by an equal
    new object, and loads (the state decoded again, as get_tuple gives it, and the next puts
    made of those objects). Each put's encoding equals codec.encode of the checkpoint, and the
    tree built from it has the nodes of a build from scratch."""
    rnd = random.Random(seed)
    enc = PutEncoder()
    msgs: list[Any] = []
    versions = {"messages": 0, "other": 0, "count": 0}
    values: dict[str, Any] = {"messages": msgs, "other": {"k": [1, 2, 3]}, "count": 0}
    n = 0
    reused = 0
    for step in range(60):
        new: dict[str, Any] = {}
        op = rnd.randrange(10)
        if op < 5 or not msgs:  # append 1-3 messages
            msgs = msgs + [_message(rnd, n + i) for i in range(rnd.randrange(1, 4))]
            n += 3
        elif op == 5:  # remove one
            msgs = [m for i, m in enumerate(msgs) if i != rnd.randrange(len(msgs))]
        elif op == 6:  # replace one with a new object
            i = rnd.randrange(len(msgs))
            msgs = msgs[:i] + [_message(rnd, n)] + msgs[i + 1:]
            n += 1
        elif op == 7:  # a kept message's field reassigned (returned as an update)
            i = rnd.randrange(len(msgs))
            if isinstance(msgs[i], dict):
                msgs[i] = {**msgs[i], "edited": step}
            elif isinstance(msgs[i], Note):
                msgs[i].text = f"edited {step}"
            else:
                msgs[i].content = f"edited {step}"
            msgs = list(msgs)
        elif op == 8:  # move the first to the end
            msgs = msgs[1:] + msgs[:1]
        else:  # nothing to the messages; another channel gets an equal new object
            values["other"] = copy.deepcopy(values["other"])
            versions["other"] += 1
            new["other"] = versions["other"]
        if op < 9:
            versions["messages"] += 1
            new["messages"] = versions["messages"]
            values["messages"] = msgs
        if rnd.random() < 0.5:
            values["count"] += 1
            versions["count"] += 1
            new["count"] = versions["count"]
        cp = {"v": 4, "id": f"id{step:04}", "ts": "2026", "channel_values": dict(values),
              "channel_versions": dict(versions), "versions_seen": {"agent": dict(versions)},
              "updated_channels": sorted(new)}
        before = enc.reused
        got = _check(enc, cp, new)
        reused += enc.reused - before
        assert tree.build(got, REG).root == tree.build(dict(cp), REG).root
        if rnd.random() < 0.2:  # a load: the next puts are made of the decoded objects
            enc.saved("t", "", got, f"cid{step}")
            loaded = codec.decode(got.data, types=REG)
            enc.loaded("t", "", f"cid{step}", loaded)
            values = dict(loaded["channel_values"])
            msgs = values["messages"]
    assert reused > 60  # (the encodings were reused: the test tests something)


def _fifty_saved(enc: PutEncoder) -> tuple[Any, Any]:
    """A put of 50 messages by ``enc``, reported saved as checkpoint ``cid1``: its encoding,
    and the checkpoint decoded from it (what a load hands ``enc.loaded``)."""
    msgs = [HumanMessage(content=f"m{i}", id=f"m{i}") for i in range(50)]
    cp = {"v": 4, "id": "1", "channel_values": {"messages": msgs},
          "channel_versions": {"messages": 1}}
    got = _check(enc, cp, {"messages": 1})
    enc.saved("t", "", got, "cid1")
    return got, codec.decode(got.data, types=REG)


def test_a_load_lets_the_next_put_encode_only_the_new_messages() -> None:
    enc = PutEncoder()
    got, loaded = _fifty_saved(enc)
    enc.loaded("t", "", "cid1", loaded)
    before = enc.encoded
    more = [*loaded["channel_values"]["messages"], AIMessage(content="new", id="n")]
    cp2 = {"v": 4, "id": "2", "channel_values": {"messages": more},
           "channel_versions": {"messages": 2}}
    _check(enc, cp2, {"messages": 2})
    assert enc.encoded - before == 1
    # a load of another checkpoint than the one last put teaches nothing
    enc.loaded("t", "", "other", codec.decode(_fresh(cp2), types=REG))
    again = codec.decode(_fresh(cp2), types=REG)["channel_values"]["messages"]
    before = enc.encoded
    _check(enc, {"v": 4, "id": "3", "channel_values": {"messages": again},
                 "channel_versions": {"messages": 3}}, {"messages": 3})
    assert enc.encoded - before == 51
    # a save reported for an older put than the last one tags nothing
    enc.saved("t", "", got, "cid-old")
    enc.loaded("t", "", "cid-old", codec.decode(got.data, types=REG))
    assert all(v.value is not loaded["channel_values"]["messages"]
               for t in enc._threads.values() for v in t.values.values())


def test_a_field_reassigned_or_an_attribute_added_is_encoded_again() -> None:
    enc = PutEncoder()
    msg = AIMessage(content="first", id="x")
    msgs = [HumanMessage(content="q", id="q"), msg]
    _check(enc, {"channel_values": {"messages": msgs}, "channel_versions": {"messages": 1}},
           {"messages": 1})
    msg.content = "second"
    _check(enc, {"channel_values": {"messages": list(msgs)},
                 "channel_versions": {"messages": 2}}, {"messages": 2})
    msg.extra_field = "added"  # type: ignore[attr-defined]  # (pydantic extra)
    _check(enc, {"channel_values": {"messages": list(msgs)},
                 "channel_versions": {"messages": 3}}, {"messages": 3})


def test_a_class_registered_since_is_encoded_with_its_registration() -> None:
    class Late(BaseModel):
        x: int

    reg = saver_registry(objects=True)
    enc = PutEncoder()
    item = Late(x=1)
    cp = {"channel_values": {"items": [item]}, "channel_versions": {"items": 1}}
    first = enc.state("t", "", cp, {"items": 1}, reg)
    assert first.data == codec.encode(cp, types=reg)  # stored as data, under its name
    reg.register(Late, "late", to_data=lambda o: [o.x], from_data=lambda d: Late(x=d[0]))
    cp2 = {"channel_values": {"items": [item]}, "channel_versions": {"items": 1}}
    second = enc.state("t", "", cp2, {}, reg)
    assert second.data == codec.encode(cp2, types=reg) != first.data


@pytest.mark.parametrize("depth", [500, 505, 506, 507, 508, 509, 510, 511, 515])
def test_nesting_at_the_codec_limit_fails_as_a_whole_encoding_does(depth: int) -> None:
    """A channel value nested ``depth`` lists deep: the pieces encode exactly when the whole
    does (the packer's limit counts from the piece's place), so a put never stores what a
    whole encoding, and so a reader, refuses."""
    deep: Any = "leaf"
    for _ in range(depth):
        deep = [deep]
    cp = {"v": 4, "channel_values": {"deep": deep, "messages": [HumanMessage(content="q")]},
          "channel_versions": {"deep": 1, "messages": 1}}
    try:
        whole: bytes | None = codec.encode(cp, types=REG)
    except SerializationError:
        whole = None
    got = PutEncoder().state("t", "", cp, {"deep": 1, "messages": 1}, REG)
    if whole is None:
        assert type(got) is dict
        with pytest.raises(SerializationError):
            tree.build(got, REG)
    else:
        assert type(got) is tree.Encoded and got.data == whole


def test_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(encode_mod, "KEYS", 8)
    monkeypatch.setattr(encode_mod, "BUDGET", 64 * 1024)
    enc = PutEncoder()
    big = ["x" * 1000] * 40  # ~40 KB: more than BUDGET // 4, not kept
    for i in range(50):
        cp = {"channel_values": {"messages": [HumanMessage(content="m" * 500)] * 3,
                                 "big": big}, "channel_versions": {"messages": 1, "big": 1}}
        _ = enc.state(f"t{i}", "", cp, {"messages": 1, "big": 1}, REG)
        assert len(enc._threads) <= 8
        assert enc._bytes <= 64 * 1024
        assert all("big" not in t.values for t in enc._threads.values())
    assert sum(t.size for t in enc._threads.values()) == enc._bytes


def test_a_subgraph_namespace_starts_from_the_parent_messages() -> None:
    """A subgraph's namespace is new for each task; the messages its parent hands it are the
    parent's objects: its first put encodes only its own new message."""
    enc = PutEncoder()
    msgs = [HumanMessage(content=f"m{i}", id=f"m{i}") for i in range(30)]
    _check(enc, {"channel_values": {"messages": msgs}, "channel_versions": {"messages": 1}},
           {"messages": 1})
    before = enc.encoded
    got = enc.state("t", "sub:task-1", {"channel_values": {"messages": [*msgs, AIMessage(
        content="sub", id="s")]}, "channel_versions": {"messages": 1}}, {"messages": 1}, REG)
    assert got.data == codec.encode(got.value, types=REG)
    assert enc.encoded - before == 1
    msgs[3].content = "changed"  # (reassigned: seen there too)
    got = enc.state("t", "sub:task-2", {"channel_values": {"messages": list(msgs)},
                                        "channel_versions": {"messages": 1}}, {}, REG)
    assert got.data == codec.encode(got.value, types=REG)


def test_a_real_graph_stores_byte_for_byte_what_a_fresh_encoding_stores(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every put of a real graph (a tool loop, a subgraph over the same messages, a
    RemoveMessage every few turns, an update_state, a replay from an older checkpoint, two
    savers over one store): the encoding the encoder made equals codec.encode of the
    checkpoint, and most puts reuse encodings."""
    from langchain_core.messages import RemoveMessage

    checked = {"encoded": 0, "whole": 0}
    state = PutEncoder.state

    def checking(self: PutEncoder, thread_id: str, ns: str, checkpoint: Any, new: Any,
                 types: Any) -> Any:
        got = state(self, thread_id, ns, checkpoint, new, types)
        if type(got) is tree.Encoded:
            assert got.data == codec.encode(dict(checkpoint), types=types)
            checked["encoded"] += 1
        else:
            checked["whole"] += 1
        return got

    monkeypatch.setattr(PutEncoder, "state", checking)

    sub = StateGraph(State)
    sub.add_node("note", lambda s: {"messages": [AIMessage(
        content=f"note {len(s['messages'])}", id=f"n{len(s['messages'])}")]})
    sub.add_edge(START, "note")
    subgraph = sub.compile()

    def trim(s: Any) -> dict[str, Any]:
        if len(s["messages"]) % 5 == 0:
            return {"messages": [RemoveMessage(id=s["messages"][0].id)]}
        return {}

    g = StateGraph(State)
    g.add_node("agent", _agent)
    g.add_node("tools", _tools)
    g.add_node("sub", subgraph)
    g.add_node("trim", trim)
    g.add_edge(START, "agent")
    g.add_conditional_edges(
        "agent", lambda s: "tools" if getattr(s["messages"][-1], "tool_calls", None) else "sub",
        ["tools", "sub"])
    g.add_edge("tools", "agent")
    g.add_edge("sub", "trim")
    g.add_edge("trim", END)
    url = "memory://encode-once-real"
    app = g.compile(checkpointer=CasSaver.from_url(url))
    cfg: Any = {"configurable": {"thread_id": "real"}}
    for turn in range(1, 13):
        app.invoke({"messages": [HumanMessage(content=f"q{turn}", id=f"h{turn}")]}, cfg)
        if turn == 4:
            app.update_state(cfg, {"messages": [HumanMessage(content="edit", id="e")]})
        if turn == 8:  # replay from an older checkpoint (a fork)
            old = list(app.get_state_history(cfg))[6].config
            app.invoke({"messages": [HumanMessage(content="fork", id="f")]}, old)
    other = g.compile(checkpointer=CasSaver.from_url(url))  # a second saver, same thread
    other.invoke({"messages": [HumanMessage(content="other", id="o")]}, cfg)
    app.invoke({"messages": [HumanMessage(content="last", id="l")]}, cfg)
    assert checked["whole"] == 0 and checked["encoded"] > 100
    enc = app.checkpointer._encoder
    assert enc.reused > 4 * enc.encoded
    values = app.get_state(cfg).values
    assert "l" in [m.id for m in values["messages"]]
    fresh = g.compile(checkpointer=CasSaver.from_url(url))  # (new objects, empty caches)
    assert fresh.get_state(cfg).values == values


def test_a_put_checks_langgraphs_metadata_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A put's metadata (LangGraph's, under ``m``) is checked as a reader would read it once:
    the keys the commit adds (``lgm``, ``lge``: its bounds) are checked alone, and the whole
    entry's size again (old code: the whole metadata walked a second time inside the commit,
    two walks a put; then one). What a reader refuses is still refused, in the commit too."""
    from langgraph.checkpoint.base import empty_checkpoint

    from cas_checkpoint.engine import model
    from cas_checkpoint.errors import InvalidArgumentError

    walked: list[dict[str, Any]] = []
    real = model._meta_problem

    def counted(meta: dict[str, Any]) -> Any:
        walked.append(meta)
        return real(meta)
    monkeypatch.setattr(model, "_meta_problem", counted)
    saver = CasSaver.from_url("memory://meta-once-" + str(random.random()))
    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    for step in range(5):
        cp = empty_checkpoint()
        walked.clear()
        config = saver.put(config, cp, {"source": "loop", "step": step, "note": "x" * 50}, {})
        # (msgpack's encoding and the reader's decoding check it: the walk in Python that
        # names a refused value's place runs only for a copy nested deep enough to be one)
        assert not walked, walked
    # an addition that makes the entry too big is refused in the commit, as before
    part = saver._core.prepare({"x": 1}, metadata={"a": "y" * (model.MAX_META_BYTES - 100)})
    with pytest.raises(InvalidArgumentError, match="bytes encoded"):
        model.add_meta(part.meta, {"b": "z" * 200})


def test_a_load_tries_the_round_trip_on_its_own_objects(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """A load's round trip of the items not tried yet encodes the objects the load decoded;
    it does not decode their bytes a second time (on 341e6b3: 50 messages decoded again, each
    an extension the decoder rebuilt). The next put still encodes only the new message."""
    enc = PutEncoder()
    _, loaded = _fifty_saved(enc)
    exts: list[int] = []
    hook = decoding._Decoder.ext_hook

    def counted(self: Any, code: int, data: bytes) -> Any:
        exts.append(code)
        return hook(self, code, data)

    monkeypatch.setattr(decoding._Decoder, "ext_hook", counted)
    enc.loaded("t", "", "cid1", loaded)
    assert exts == []
    before = enc.encoded
    more = [*loaded["channel_values"]["messages"], AIMessage(content="new", id="n")]
    _check(enc, {"v": 4, "id": "2", "channel_values": {"messages": more},
                 "channel_versions": {"messages": 2}}, {"messages": 2})
    assert enc.encoded - before == 1
