"""The work of one CasSaver put / put_writes on memory:// (issue 29: memory:// saves <= 3x
InMemorySaver's): a tool-calling loop's calls, recorded from InMemorySaver and replayed into a
fresh CasSaver, counted call by call at steady state: Python function calls made inside
cas_checkpoint, codec calls a put makes to encode its checkpoint, Walker steps of the tree
split, threading.Events made by callers that commit at once. Counts, not times."""

from __future__ import annotations

import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph

import cas_checkpoint
from cas_checkpoint.engine import object_store
from cas_checkpoint.format import codec
from cas_checkpoint.integrations.langgraph import CasSaver
from cas_checkpoint.integrations.langgraph import encode as lg_encode
from cas_checkpoint.tree import cuts

PACKAGE = str(Path(cas_checkpoint.__file__).parent)
STEPS = 12


def recorded_calls(steps: int = STEPS) -> list[tuple[str, tuple[Any, ...]]]:
    """The put and put_writes calls of a tool-calling loop of ``steps`` tool calls (~300
    characters a message), in order, arguments as LangGraph handed them."""
    calls: list[tuple[str, tuple[Any, ...]]] = []

    class Recorder(InMemorySaver):
        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            calls.append(("put", (config, checkpoint, metadata, dict(new_versions))))
            return super().put(config, checkpoint, metadata, new_versions)

        def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = ""
                       ) -> None:
            calls.append(("put_writes", (config, list(writes), task_id, task_path)))
            super().put_writes(config, writes, task_id, task_path)

    def model(state: MessagesState) -> dict[str, Any]:
        n = sum(isinstance(m, ToolMessage) for m in state["messages"])
        text = f"thinking about step {n} " * 12
        if n >= steps:
            return {"messages": [AIMessage(content=text, id=f"ai-{n}-final")]}
        return {"messages": [AIMessage(content=text, id=f"ai-{n}", tool_calls=[
            {"name": "lookup", "args": {"q": n}, "id": f"call-{n}"}])]}

    def tool(state: MessagesState) -> dict[str, Any]:
        last = state["messages"][-1]
        assert isinstance(last, AIMessage)
        n = len(state["messages"])
        return {"messages": [ToolMessage(content=f"result {n} " * 30, id=f"tool-{n}",
                                         tool_call_id=last.tool_calls[0]["id"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tool", tool)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", lambda s: "tool" if s["messages"][-1].tool_calls
                                else END)
    graph.add_edge("tool", "model")
    graph.compile(checkpointer=Recorder()).invoke(
        {"messages": [HumanMessage(content="go", id="human-0")]},
        {"configurable": {"thread_id": "t1"}, "recursion_limit": 4 * steps + 20})
    return calls


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The counts are those of an application without an OpenTelemetry SDK: a test that
    installed one earlier in the process (test_telemetry) puts every operation in a span,
    ~9 Python calls a put more."""
    from cas_checkpoint.engine import telemetry

    monkeypatch.setattr(telemetry, "ENABLED", False)


@pytest.fixture(scope="module")
def calls() -> list[tuple[str, tuple[Any, ...]]]:
    return recorded_calls()


def _fresh() -> CasSaver:
    return CasSaver.from_url(f"memory://percall-{uuid.uuid4().hex[:8]}")


def _steady(calls: list[tuple[str, tuple[Any, ...]]]) -> Iterator[tuple[str, Any, Any]]:
    """Each call replayed into a fresh saver, as (kind, the saver, its arguments), after the
    same calls went once through another saver of the process (imports and process-wide
    tables warm, as in a long-running application)."""
    warm = _fresh()
    for kind, args in calls:
        getattr(warm, kind)(*args)
    saver = _fresh()
    for kind, args in calls:
        yield kind, saver, args


def _counted_in_steady(monkeypatch: pytest.MonkeyPatch, calls: list[tuple[str, tuple[Any, ...]]],
                       owner: type, name: str) -> tuple[int, int]:
    """(calls of ``owner.name`` made inside the steady calls, how many steady calls):
    ``owner.name`` wrapped to count while one of ``_steady``'s calls runs."""
    counted = 0
    on = False  # counting (the steady calls only)
    real = getattr(owner, name)

    def counting(*args: Any, **kw: Any) -> Any:
        nonlocal counted
        counted += on
        return real(*args, **kw)

    monkeypatch.setattr(owner, name, counting)
    n = 0
    for kind, saver, args in _steady(calls):
        n += 1
        on = True
        getattr(saver, kind)(*args)
        on = False
    return counted, n


def test_python_calls_per_call(calls: list[tuple[str, tuple[Any, ...]]]) -> None:
    """Python function calls inside cas_checkpoint, a call (mean over the loop; main before
    session 13's cuts: 386 a put, 165 a put_writes; before session 14's: 319 and 158; before
    session 15's: 305 and 144; now ~276 and ~125)."""
    per: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    n = 0

    def prof(frame: Any, event: str, arg: Any) -> None:
        nonlocal n
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            n += 1

    for kind, saver, args in _steady(calls):
        n = 0
        sys.setprofile(prof)
        try:
            getattr(saver, kind)(*args)
        finally:
            sys.setprofile(None)
        per[kind] += n
        kinds[kind] += 1
    put = per["put"] / kinds["put"]
    writes = per["put_writes"] / kinds["put_writes"]
    assert put <= 282, f"{put:.1f} Python calls inside cas_checkpoint a put"
    assert writes <= 130, f"{writes:.1f} Python calls inside cas_checkpoint a put_writes"


def test_a_stamp_makes_no_view_of_the_packs(monkeypatch: pytest.MonkeyPatch,
                                             calls: list[tuple[str, tuple[Any, ...]]]) -> None:
    """A save's stamp (put's lgm, put_writes' lge) and put's parent lookup read the newest
    entries, which are in the head's tail: no view of the head's packs is made for them
    (``ObjectStore.view`` makes one a head: the packs it names, fetched or found cached),
    but when the tail is empty (a leaf of 16 entries just went into a segment) or does not
    reach back far enough. Main: one view a call once the log has segments (~0.8 a call)."""
    made: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    kind = ""
    real = object_store.View

    def counted(*a: Any, **kw: Any) -> Any:
        made[kind] += 1
        return real(*a, **kw)

    monkeypatch.setattr(object_store, "View", counted)
    for kind, saver, args in _steady(calls):
        kinds[kind] += 1
        getattr(saver, kind)(*args)
    assert kinds["put_writes"] >= 2 * STEPS
    assert made["put_writes"] <= kinds["put_writes"] / 8, (made, kinds)
    assert made["put"] <= kinds["put"] / 8, (made, kinds)


def test_codec_calls_and_walker_steps_per_put(monkeypatch: pytest.MonkeyPatch,
                                              calls: list[tuple[str, tuple[Any, ...]]]
                                              ) -> None:
    """A put encodes its checkpoint's fields in a few codec calls (the runs of fields around
    channel_values; channel names from a table), whatever the number of fields and channels
    (main: one call a field, a field's name and a channel's name: ~17), and the tree split
    steps over no dict's keys and values one Python call at a time (main: two Walker.skip
    calls a key, ~17 a put)."""
    counts: Counter[str] = Counter()
    on = False  # counting (the steady puts only)
    nested, skip = codec.encode_nested, cuts.Walker.skip

    def counted_nested(*a: Any, **kw: Any) -> bytes:
        counts["encode_nested"] += on
        return nested(*a, **kw)

    def counted_skip(self: cuts.Walker, value: Any = None) -> None:
        counts["skip"] += on
        skip(self, value)

    monkeypatch.setattr(lg_encode, "encode_nested", counted_nested)
    monkeypatch.setattr(cuts.Walker, "skip", counted_skip)
    puts = 0
    for kind, saver, args in _steady(calls):
        on = kind == "put"
        puts += on
        getattr(saver, kind)(*args)
        on = False
    assert puts >= 2 * STEPS
    # the fields before and after channel_values (2), a changed list's new items (1 a run),
    # a small channel changed (1 each): ~4 a put in this loop
    assert counts["encode_nested"] / puts <= 5, counts
    assert counts["skip"] == 0, counts


def test_a_caller_that_commits_at_once_makes_no_event(
        monkeypatch: pytest.MonkeyPatch, calls: list[tuple[str, tuple[Any, ...]]]) -> None:
    """One caller at a time (no commit in flight): each commits its own part at once and
    waits on nothing, so it makes no threading.Event (main: one a call; counted by the
    Condition each Event makes)."""
    made = 0
    real = threading.Condition

    def counted(*args: Any) -> Any:
        nonlocal made
        made += 1
        return real(*args)

    saver = _fresh()
    monkeypatch.setattr(threading, "Condition", counted)
    for kind, args in calls:
        getattr(saver, kind)(*args)
    assert made == 0


def test_a_log_entry_is_packed_once(monkeypatch: pytest.MonkeyPatch,
                                    calls: list[tuple[str, tuple[Any, ...]]]) -> None:
    """A commit packs its new log entry once (for the head's tail); a segment made of the
    tail's 16 entries reuses their bytes (main: packed each of them again, ~1.9 entries a
    put_writes more, ~2.4 a call in all, as segments fill on either kind)."""
    from cas_checkpoint.format import objects
    from cas_checkpoint.format.objects import LogEntry

    # (a fresh memo of packed entries: one that earlier tests filled could roll over inside
    # the counted calls and pack the tail's entries again, whatever ran before this test)
    monkeypatch.setattr(objects, "_PACKED", {})
    packed, n = _counted_in_steady(monkeypatch, calls, LogEntry, "pack")
    assert packed <= n * 1.05, (packed, n)


def test_memory_hands_out_a_ref_as_written() -> None:
    """memory:// reads a ref (and an object) as the very bytes object written, and compares
    a ref's bytes with the version remembered for them by identity first: no copy of the
    head a commit (main: two copies on each compare-and-swap and on each read)."""
    from cas_checkpoint.backends import open_backend

    backend = open_backend(f"memory://percall-{uuid.uuid4().hex[:8]}")
    head = bytes(range(256)) * 40
    version = backend.write_ref("refs/heads/t", head, None)
    got = backend.read_ref("refs/heads/t")
    assert got is not None and got[1] == version
    assert got[0] is head, "read_ref copied the ref"
    again = head[:1] + head[1:]  # equal bytes, another object: compared, that version
    assert again is not head and backend.write_ref("refs/heads/t", again, version) != version
    backend.put_many({"objects/x": head})
    assert backend.get_many(["objects/x"])["objects/x"] is head, "get_many copied the object"


def test_the_sync_face_makes_no_checkpoint_info(monkeypatch: pytest.MonkeyPatch,
                                                calls: list[tuple[str, tuple[Any, ...]]]
                                                ) -> None:
    """A put answers with its entry's id and a put_writes with nothing: their commit hands
    back the parts' log entries, and no ``CheckpointInfo`` (a frozen 12-field record and a
    datetime) is made for them (341e6b3: one a call)."""
    from cas_checkpoint.engine import model

    made, n = _counted_in_steady(monkeypatch, calls, model.CheckpointInfo, "__init__")
    assert n >= 4 * STEPS and made == 0, (made, n)
