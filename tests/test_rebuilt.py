"""Objects the decoder rebuilt are copied, not built again, when the same bytes are decoded
again (``format/rebuilt.py``; issue 29: the latest-state read of a LangGraph thread decodes
every message at every read). Counts of ``__init__`` calls, not times; and what is returned
is what a fresh decode gives, whatever a caller did to what it got before."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pydantic
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, MessagesState, StateGraph

from cas_checkpoint.format import codec
from cas_checkpoint.format.rebuilt import REBUILT
from cas_checkpoint.integrations.langgraph import CasSaver

BUILT: list[str] = []


class Note(pydantic.BaseModel):  # as LangChain's messages: a model with its own __init__
    text: str
    tags: dict[str, Any] = {}
    refs: list[Any] = []
    seen: int | None = None

    def __init__(self, **data: Any) -> None:
        BUILT.append(data.get("text", ""))
        super().__init__(**data)


class Stamped(pydantic.BaseModel):  # a field the stored data does not give: made at build
    text: str
    token: str = pydantic.Field(default_factory=lambda: uuid.uuid4().hex)


class Loaded(pydantic.BaseModel):  # a container that msgpack would not give back: built again
    text: str
    tags: dict[str, Any]

    def __init__(self, **data: Any) -> None:
        BUILT.append(data.get("text", ""))
        super().__init__(**data)


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    REBUILT.clear()
    BUILT.clear()
    yield
    REBUILT.clear()


def test_the_same_bytes_decoded_again_build_nothing() -> None:
    reg = codec.TypeRegistry([Note])
    notes = [Note(text=f"note {i}", seen=i) for i in range(40)] + [
        Note(text=f"call {i}", tags={"args": {"q": [i, 1.5, True, None, "x"]}, b"k": b"v"},
             refs=[i, [i]]) for i in range(10)]
    data = codec.encode(notes, types=reg)
    BUILT.clear()
    codec.decode(data, types=reg)  # the first time: noted only
    assert len(BUILT) == 50 and REBUILT.kept == 0
    first = codec.decode(data, types=reg)  # the second: kept
    assert len(BUILT) == 100 and REBUILT.kept == 50
    second = codec.decode(data, types=reg)
    assert len(BUILT) == 100  # none built again: 50 copies
    assert second == first == notes
    assert all(a is not b for a, b in zip(first, second, strict=True))
    assert all(a.tags is not b.tags and a.refs is not b.refs
               for a, b in zip(first, second, strict=True))
    assert second[-1].tags["args"] is not first[-1].tags["args"]  # (new all the way down)
    assert second[-1].refs[1] is not first[-1].refs[1]
    fields_set = [set(n.model_fields_set) for n in first]
    assert [n.model_fields_set for n in second] == fields_set
    # what a caller does to what it got never reaches the next decode
    for got in (first, second):
        for note in (got[0], got[-1]):
            note.tags["k"] = 1
            note.refs.append(1)
            note.text = "changed"
            note.__pydantic_fields_set__.add("x")
        got[-1].tags["args"]["q"].append(2)
        got[-1].refs[1].append(2)
    third = codec.decode(data, types=reg)
    assert third == notes and len(BUILT) == 100
    assert [n.model_fields_set for n in third] == fields_set
    # another registry of the same class uses the kept objects too (a new saver's)
    assert codec.decode(data, types=codec.TypeRegistry([Note])) == notes
    assert len(BUILT) == 100


def test_only_what_a_copy_rebuilds_exactly_is_kept() -> None:
    reg = codec.TypeRegistry([Stamped, Loaded])
    data = codec.encode([Loaded(text="a", tags={"k": (1, 2)})], types=reg)
    BUILT.clear()
    one, two, three = (codec.decode(data, types=reg) for _ in range(3))
    assert len(BUILT) == 3 and one == two == three and one[0].tags is not three[0].tags
    # stored without its token (by an older class): each decode makes a token of its own
    name = reg._by_class[Stamped].name
    data = codec.encode(codec.ObjectData(name, {"text": "a"}), types=reg)
    one, two, three = (codec.decode(data, types=reg) for _ in range(3))
    assert len({one.token, two.token, three.token}) == 3
    assert REBUILT.kept == 0


def test_a_name_registered_to_another_class_is_not_copied() -> None:
    class Other(pydantic.BaseModel):
        text: str
        tags: dict[str, Any] = {}
        refs: list[Any] = []
        seen: int | None = None

    reg = codec.TypeRegistry([Note])
    data = codec.encode([Note(text="x")], types=reg)
    codec.decode(data, types=reg)
    codec.decode(data, types=reg)
    assert REBUILT.kept == 1
    other = codec.TypeRegistry()
    other.register(Other, name=reg._by_class[Note].name)
    got = codec.decode(data, types=other)
    assert type(got[0]) is Other


def test_a_saver_reads_an_unchanged_state_without_building_a_message(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The latest-state read of a thread whose state did not change: once read twice, a read
    (on the same saver, and on a new one) builds no message, and returns equal new objects."""
    built: list[type] = []
    for cls in (AIMessage, HumanMessage):
        init = cls.__init__

        def counted(self: Any, *a: Any, _init: Any = init, **kw: Any) -> None:
            built.append(type(self))
            _init(self, *a, **kw)

        monkeypatch.setattr(cls, "__init__", counted)

    def model(state: MessagesState) -> dict[str, Any]:
        n = len(state["messages"])
        return {"messages": [AIMessage(  # (as a chat model's: tool calls, metadata, usage)
            content="ok " * 40, id=f"ai-{n}", response_metadata={"model_name": "m", "n": n},
            tool_calls=[{"name": "search", "args": {"q": "x", "k": [n]}, "id": f"c-{n}"}],
            usage_metadata={"input_tokens": n, "output_tokens": 3, "total_tokens": n + 3})]}

    url = f"memory://rebuilt-{uuid.uuid4().hex[:8]}"
    saver = CasSaver.from_url(url)
    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_edge(START, "model")
    graph = builder.compile(checkpointer=saver)
    cfg: Any = {"configurable": {"thread_id": "t"}}
    for t in range(20):
        graph.invoke({"messages": [HumanMessage(content="hi " * 40, id=f"h-{t}")]}, cfg)
    saver.get_tuple(cfg)  # (a message decoded the first time is only noted: see rebuilt.py)
    first = saver.get_tuple(cfg)
    assert first is not None
    built.clear()
    again = saver.get_tuple(cfg)
    new = CasSaver.from_url(url).get_tuple(cfg)
    assert again is not None and new is not None
    msgs = first.checkpoint["channel_values"]["messages"]
    assert len(msgs) == 40
    assert built == []  # 0 messages built for 80 read
    for got in (again, new):
        other = got.checkpoint["channel_values"]["messages"]
        assert other == msgs and all(a is not b for a, b in zip(msgs, other, strict=True))
