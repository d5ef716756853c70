"""CasSaver as a drop-in for LangGraph's own savers (issue 28): what LangGraph itself writes
round-trips (metadata tuples, str subclasses, node errors, other savers' channel versions,
the classes of a graph's own schemas), and prune does what LangGraph documents. Each test runs
on a local folder and on memory://."""

from __future__ import annotations

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
