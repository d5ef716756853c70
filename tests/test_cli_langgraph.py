"""The command line on LangGraph threads (CasSaver on a local directory): real graphs (a
tool-calling loop with a scripted model and an ``interrupt()`` before its answer, the same loop
inside a subgraph), then the commands, checked against what LangGraph itself says
(``get_state``, ``get_state_history``) before and after. Run in-process (test_cli.py has the
one test through a real process)."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, interrupt
from pydantic import BaseModel, ConfigDict

from cas_checkpoint import CheckpointInfo, CheckpointStore
from cas_checkpoint.cli import langgraph as lg
from cas_checkpoint.cli import main
from cas_checkpoint.cli.render import follow, parse_path
from cas_checkpoint.integrations.langgraph import CasSaver

TOOL_CALLS = 3


class Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class State(TypedDict):
    messages: Annotated[list[Any], add_messages]


@tool
def lookup(order: str) -> str:
    """Look up an order."""
    return f"order {order}: shipped; the refund policy is 30 days"


def model(state: State) -> dict[str, Any]:
    """A scripted model: a tool call per turn until it has TOOL_CALLS results, then an answer."""
    done = sum(isinstance(m, ToolMessage) for m in state["messages"])
    if done < TOOL_CALLS:
        return {"messages": [AIMessage(content=f"checking order {done}", tool_calls=[
            {"name": "lookup", "args": {"order": str(done)}, "id": f"call-{done}"}])]}
    return {"messages": [AIMessage(content="all found: refund approved, pending sign-off")]}


def route(state: State) -> str:
    return "tools" if state["messages"][-1].tool_calls else "approve"


def approve(state: State) -> dict[str, Any]:
    answer = interrupt({"question": "approve the refund?"})
    return {"messages": [AIMessage(content=f"the human said {answer}")]}


def agent() -> Any:
    b = StateGraph(State)
    b.add_node("model", model)
    b.add_node("tools", ToolNode([lookup]))
    b.add_node("approve", approve)
    b.add_edge(START, "model")
    b.add_conditional_edges("model", route, ["tools", "approve"])
    b.add_edge("tools", "model")
    b.add_edge("approve", END)
    return b


def nested() -> Any:
    """The agent as a subgraph: its checkpoints go to a namespace of their own."""
    b = StateGraph(State)
    b.add_node("agent", agent().compile())
    b.add_edge(START, "agent")
    b.add_edge("agent", END)
    return b


def cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def paused(url: str, thread: str = "agent-1", builder: Any = None) -> tuple[Any, CasSaver]:
    """A graph on CasSaver over ``url`` and a thread of it stopped in interrupt()."""
    saver = CasSaver(CheckpointStore.open(url))
    graph = (builder or agent()).compile(checkpointer=saver)
    graph.invoke({"messages": [HumanMessage(content="refund order 7?")]}, cfg(thread))
    assert graph.get_state(cfg(thread), subgraphs=True).interrupts
    return graph, saver


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    code, out, err = run(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def entries(url: str, name: str = 'lg:["agent-1",""]') -> list[CheckpointInfo]:
    return CheckpointStore.open(url).history(name)


def test_threads_count_checkpoints_apart_from_pending_writes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "s")
    graph, saver = paused(url)
    lg_checkpoints = len(list(saver.list(cfg("agent-1"))))
    every = entries(url)
    writes = sum("w" in e.metadata for e in every)
    assert writes and len(every) == lg_checkpoints + writes
    got = run_json(capsys, "threads", url)["threads"]
    assert len(got) == 1 and got[0]["thread"] == 'lg:["agent-1",""]'
    assert got[0]["checkpoints"] == lg_checkpoints and got[0]["pending_writes"] == writes
    latest = graph.get_state(cfg("agent-1"))
    assert got[0]["langgraph"] == {"thread_id": "agent-1", "checkpoint_ns": "",
                                   "checkpoint_id": latest.config["configurable"]
                                   ["checkpoint_id"]}
    assert got[0]["head_step"] == latest.metadata["step"]
    code, out, _ = run(capsys, "threads", url)
    row = out.splitlines()[1].split()
    assert code == 0 and row[:3] == ["agent-1", str(lg_checkpoints), str(writes)]


def test_log_shows_langgraphs_fields_and_next_nodes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "s")
    graph, _ = paused(url)
    history = list(graph.get_state_history(cfg("agent-1")))  # newest first
    got = run_json(capsys, "log", url, "agent-1")
    assert got["checkpoints"] == len(history) == len(got["log"])
    assert got["pending_writes"] == sum("w" in e.metadata for e in entries(url))
    for snap, entry in zip(history, got["log"], strict=True):
        fields = entry["langgraph"]
        assert fields["checkpoint_id"] == snap.config["configurable"]["checkpoint_id"]
        assert fields["step"] == snap.metadata["step"]
        assert fields["source"] == snap.metadata["source"]
        assert fields["next"] == list(snap.next)  # what LangGraph says runs next
    assert got["log"][0]["head"] and got["log"][0]["langgraph"]["special_writes"] == ["interrupt"]
    code, out, _ = run(capsys, "log", url, "agent-1")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 1 + len(history)
    assert "lg=" not in out and "lgp=" not in out and "m={" not in out
    assert lines[1].startswith("* ") and "next approve" in lines[1]
    assert "writes 1 (interrupt)" in lines[1] and "loop" in lines[1]
    assert f"checkpoint_id={history[0].config['configurable']['checkpoint_id']}" in lines[1]
    assert "input" in lines[-1] and "next __start__" in lines[-1]
    code, out, _ = run(capsys, "log", url, "agent-1", "--graph")
    assert code == 0 and out.count("checkpoint_id=") == len(history)


def test_checkpoints_are_named_by_langgraphs_ids_and_tilde_counts_checkpoints(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "s")
    graph, _ = paused(url)
    history = list(graph.get_state_history(cfg("agent-1")))
    ids = [s.config["configurable"]["checkpoint_id"] for s in history]
    for n in (0, 1, 4):
        for spec in ([f"agent-1~{n}"], ['lg:["agent-1",""]' + f"~{n}"], ["agent-1", f"~{n}"]):
            got = run_json(capsys, "show", url, *spec)
            assert got["checkpoint"]["metadata"]["lg"] == ids[n], spec
            assert got["value"]["id"] == ids[n]
    got = run_json(capsys, "show", url, "agent-1")  # the head: the latest checkpoint
    assert got["langgraph"]["checkpoint_id"] == ids[0]
    assert got["langgraph"]["special_writes"] == ["interrupt"]
    short = next(ids[3][:n] for n in range(13, 37)
                 if sum(i.startswith(ids[3][:n]) for i in ids) == 1)  # (ids share long prefixes)
    for spec in ([ids[3]], ["agent-1", ids[3]], [short], ["agent-1", short]):
        got = run_json(capsys, "show", url, *spec)
        assert got["checkpoint"]["metadata"]["lg"] == ids[3], spec
    code, _, err = run(capsys, "show", url, ids[0][:10])
    assert code == 2 and f"names {len(ids)} LangGraph checkpoints" in err and "give more" in err
    code, _, err = run(capsys, "show", url, f"agent-1~{len(ids)}")
    assert code == 2 and f"has {len(ids)} checkpoints" in err
    code, out, err = run(capsys, "show", url, ids[2])
    assert code == 0 and f"checkpoint_id {ids[2]}" in out and "lg=" not in out, err
    d = run_json(capsys, "diff", url, ids[1], ids[0])
    assert d["a"]["metadata"]["lg"] == ids[1] and d["b"]["metadata"]["lg"] == ids[0]
    assert run_json(capsys, "diff", url, "agent-1~1", "agent-1")["changes"] == d["changes"]
    code, out, _ = run(capsys, "diff", url, "agent-1~1", "agent-1")
    step = history[0].metadata["step"]
    assert code == 0 and f"(LangGraph step {step}, {ids[0]})" in out.splitlines()[1]


def test_prune_keep_last_keeps_the_interrupt_and_the_thread_resumes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "s")
    graph, saver = paused(url)
    before = graph.get_state(cfg("agent-1"))
    name = 'lg:["agent-1",""]'  # (the bare id is another test's)
    code, out, err = run(capsys, "prune", url, name, "--keep-last", "1", "--dry-run")
    assert code == 0 and "would remove" in out and len(entries(url)) > 2, err
    code, out, err = run(capsys, "prune", url, name, "--keep-last", "1")
    assert code == 0, err
    left = entries(url)
    assert sum("lg" in e.metadata for e in left) == 1  # one LangGraph checkpoint
    assert [e.metadata["w"] for e in left if "w" in e.metadata] == [
        before.config["configurable"]["checkpoint_id"]]  # and its pending write: the interrupt
    after = CasSaver(CheckpointStore.open(url))
    graph = agent().compile(checkpointer=after)
    state = graph.get_state(cfg("agent-1"))
    assert state.interrupts == before.interrupts and state.next == ("approve",)
    assert state.values == before.values
    done = graph.invoke(Command(resume="yes"), cfg("agent-1"))
    assert done["messages"][-1].content == "the human said yes"
    assert run_json(capsys, "threads", url)["threads"][0]["checkpoints"] == 2


def test_prune_every_thread_keeps_each_namespaces_latest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A subgraph paused inside interrupt(): each namespace keeps its latest checkpoint and
    pending writes; a plain thread beside them is pruned as before."""
    url = str(tmp_path / "s")
    graph, _ = paused(url, builder=nested())
    store = CheckpointStore.open(url)
    for i in range(5):
        store.save("plain", {"i": i})
    before = graph.get_state(cfg("agent-1"), subgraphs=True)
    assert len(store.threads()) == 3  # the root namespace, the subgraph's, "plain"
    code, out, err = run(capsys, "prune", url, "--keep-last", "1")
    assert code == 0, err
    for name in store.threads():
        hist = store.history(name)
        if name == "plain":
            assert len(hist) == 1
        else:
            assert sum("lg" in e.metadata for e in hist) == 1
            assert all(e.metadata.get("w") == hist_lg for e in hist if "w" in e.metadata
                       for hist_lg in [next(h.metadata["lg"] for h in hist if "lg" in h.metadata)])
    graph = nested().compile(checkpointer=CasSaver(CheckpointStore.open(url)))
    after = graph.get_state(cfg("agent-1"), subgraphs=True)
    assert after.interrupts == before.interrupts and after.tasks[0].state is not None
    done = graph.invoke(Command(resume="ok"), cfg("agent-1"))
    assert done["messages"][-1].content == "the human said ok"


def test_a_langgraph_thread_id_names_its_thread(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "s")
    paused(url, builder=nested())
    names = CheckpointStore.open(url).threads()
    sub = next(n for n in names if n != 'lg:["agent-1",""]')
    code, out, err = run(capsys, "log", url, "agent-1")
    assert code == 0 and out.startswith("thread 'lg:[\"agent-1\",\"\"]'")
    ns = json.loads(sub[3:])[1]
    assert "also has namespace" in err and repr(ns) in err and sub in err  # which, and how
    code, out, err = run(capsys, "log", url, sub)
    assert code == 0 and f"namespace {ns!r}" in out and "note" not in err
    got = run_json(capsys, "show", url)  # one LangGraph thread: its root namespace's latest
    assert got["checkpoint"]["thread"] == 'lg:["agent-1",""]' and got["langgraph"]["next"]
    code, _, err = run(capsys, "log", url, "agent-2")
    assert code == 2 and "does not exist" in err


def test_stats_by_thread_counts_the_messages(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "s")
    graph, _ = paused(url)
    n = len(graph.get_state(cfg("agent-1")).values["messages"])
    got = run_json(capsys, "stats", url, "--by-thread")["by_thread"]['lg:["agent-1",""]']
    assert got["messages"] == n == 2 + 2 * TOOL_CALLS
    assert got["checkpoints"] == len(list(graph.get_state_history(cfg("agent-1"))))
    code, out, _ = run(capsys, "stats", url, "--by-thread")
    assert code == 0 and f" {n} " in out.splitlines()[-1]


def test_the_paths_search_prints_are_accepted_by_show(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "s")
    paused(url)
    found = run_json(capsys, "search", url, "refund policy", "--all-history")["matches"]
    assert {m["path"] for m in found} >= {f'["channel_values"]["messages"][{2 + 2 * i}].content'
                                          for i in range(TOOL_CALLS)}
    for m in found:  # in checkpoints and in pending writes
        assert m["path"].endswith(".content")
        got = run_json(capsys, "show", url, m["checkpoint"], "--path", m["path"],
                       "--types", "langgraph")
        assert "refund policy" in got["value"]
        code, out, err = run(capsys, "show", url, m["checkpoint"], "--path",
                             "state" + m["path"], "--state-only")
        assert code == 0 and "refund policy" in out, err
    got = run_json(capsys, "show", url, "agent-1", "--path",
                   'channel_values.messages[1].tool_calls[0]["args"]')
    assert got["value"] == {"order": "0"}


def test_show_path_reads_every_form_search_prints(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Object fields with names that are not identifiers, and dict keys that are not str."""
    url = str(tmp_path / "s")
    msg = AIMessage(content="x", additional_kwargs={"odd key": "needle one"})
    store = CheckpointStore.open(url, types=[AIMessage, Loose])
    loose = {"m": [msg, Loose(**{"odd field": "needle four"})]}
    store.save("t", {"m": [msg], "k": {(1, 2): "needle two", 1.5: "needle three"}})
    store.save("u", loose)
    code, out, err = run(capsys, "search", url, "needle", "--json")
    paths = sorted((m["thread"], m["path"]) for m in json.loads(out)["matches"])
    assert paths == [("t", '["k"][(1, 2)]'), ("t", '["k"][1.5]'),
                     ("t", '["m"][0].additional_kwargs["odd key"]'),
                     ("u", '["m"][0].additional_kwargs["odd key"]'),
                     ("u", '["m"][1]."odd field"')], err
    for thread, path in paths[:3]:  # (the store's classes come with --types langgraph)
        got = run_json(capsys, "show", url, thread, "--path", path, "--types", "langgraph")
        assert got["value"].startswith("needle"), path
    # (Loose cannot be named on the command line: its path is read by show's own functions)
    assert follow(loose, parse_path(paths[-1][1])) == "needle four"
    code, _, err = run(capsys, "show", url, "t", "--path", '["k"][(1, 2', "--types", "langgraph")
    assert code == 2 and "cannot read the path" in err


def test_log_of_the_last_two(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "s")
    paused(url)
    code, out, err = run(capsys, "log", url, "agent-1", "-n", "2")
    assert code == 0 and "2 shown" in out and "writes 1 (interrupt)" in out, err


# --- prune's plan, pure ---


def _info(n: int, meta: dict[str, Any], *, parents: tuple[str, ...] = ()) -> CheckpointInfo:
    return CheckpointInfo(f"{n:064x}", 'lg:["t",""]', n, parents,  # type: ignore[arg-type]
                          datetime.fromtimestamp(1_000 + n, UTC), 10, metadata=meta)


def _delta_thread() -> Any:
    """Checkpoints 0..9; a DeltaChannel 'log' snapshotted at 3 (its counter absent there) and
    counting since; every checkpoint has a pending write; one write's checkpoint is absent."""
    from cas_checkpoint.cli import langgraph as lg

    hist = []
    for n in range(10):
        m: dict[str, Any] = {"step": n, "source": "loop", "parents": {}}
        if n > 3:
            m["counters_since_delta_snapshot"] = {"log": [n - 3, n - 3]}
        hist.append(_info(n, {"lg": f"1f0-{n:04d}", "lgp": f"1f0-{n - 1:04d}" if n else None,
                              "m": m}))
        hist.append(_info(100 + n, {"w": f"1f0-{n:04d}", "task": f"t{n}"}))
    hist.append(_info(200, {"w": "1f0-0010", "task": "landing"}))  # its checkpoint: not yet
    return lg, lg.split('lg:["t",""]', list(reversed(hist)))


def test_prune_plan_keeps_what_a_delta_channel_is_rebuilt_from() -> None:
    lg, lgt = _delta_thread()
    plan = lg.plan(lgt, keep_last=1, older_than=None, keep_labeled=True, keep_tags=())
    assert sorted(i.metadata["lg"] for i in plan.kept) == [f"1f0-{n:04d}" for n in range(3, 10)]
    assert plan.reasons == {"head": 1, "delta": 6}
    kept_writes = sorted(i.metadata["w"] for i in plan.kept_writes)
    assert kept_writes == [f"1f0-{n:04d}" for n in range(3, 11)]  # and the landing one
    assert sorted(i.metadata["w"] for i in plan.removed_writes) == [
        f"1f0-{n:04d}" for n in range(3)]
    plan = lg.plan(lgt, keep_last=None, older_than=None, keep_labeled=True, keep_tags=())
    assert len(plan.kept) == 7  # the latest (no policy keeps more) and its delta ancestors


def test_prune_removes_only_what_it_planned(tmp_path: Path) -> None:
    """Entries saved between the plan and the swap stay (a concurrent writer loses nothing)."""
    from cas_checkpoint.cli import langgraph as lg

    url = str(tmp_path / "s")
    graph, _ = paused(url)
    store = CheckpointStore.open(url)
    name = 'lg:["agent-1",""]'
    lgt = lg.read(store, name)
    assert lgt is not None
    plan = lg.plan(lgt, keep_last=1, older_than=None, keep_labeled=True, keep_tags=())
    graph.invoke(Command(resume="later"), cfg("agent-1"))  # lands after the plan
    new = {e.id for e in store.history(name)} - {i.id for i in lgt.checkpoints} - {
        i.id for ws in lgt.writes.values() for i in ws}
    assert new
    lg.remove(store, name, plan.remove_ids)
    left = {e.id for e in store.history(name)}
    assert new <= left and not plan.remove_ids & left
    state = graph.get_state(cfg("agent-1"))
    assert state.values["messages"][-1].content == "the human said later" and not state.next


def test_prune_keeps_what_a_delta_channel_needs(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A DeltaChannel stores its value every few updates only; the checkpoints between hold
    none, and LangGraph rebuilds it from the last snapshot and the pending writes since. So
    prune --keep-last 1 keeps the latest checkpoint, its ancestors back to that snapshot, and
    their writes: the values read back the same and the thread goes on."""
    from langgraph.channels.delta import DeltaChannel
    from langgraph.graph.message import _messages_delta_reducer

    from cas_checkpoint.errors import CasError

    channel = DeltaChannel(_messages_delta_reducer, snapshot_frequency=4)
    delta_state = TypedDict("delta_state", {"messages": Annotated[list, channel]})  # type: ignore[misc]  # noqa: UP013

    def respond(state: dict[str, Any]) -> dict[str, Any]:
        n = len(state["messages"])
        return {"messages": [AIMessage(content=f"reply {n}", id=f"ai{n}")]}

    b = StateGraph(delta_state)
    b.add_node("respond", respond)
    b.add_edge(START, "respond")
    url = str(tmp_path / "s")
    graph = b.compile(checkpointer=CasSaver(CheckpointStore.open(url)))
    try:
        for i in range(7):
            graph.invoke({"messages": [HumanMessage(content=f"q{i}", id=f"h{i}")]}, cfg("d"))
    except CasError as exc:  # a saver without issue 28's fix A refuses LangGraph's tuples
        pytest.skip(f"this CasSaver cannot store a DeltaChannel graph yet: {exc}")
    before = graph.get_state(cfg("d")).values
    assert len(before["messages"]) == 14
    name = 'lg:["d",""]'
    total = sum("lg" in e.metadata for e in entries(url, name))
    got = run_json(capsys, "prune", url, "d", "--keep-last", "1")["threads"][name]
    kept = len(got["kept"])
    assert 1 < kept < total and got["reasons"] == {"head": 1, "delta": kept - 1}
    graph = b.compile(checkpointer=CasSaver(CheckpointStore.open(url)))
    assert graph.get_state(cfg("d")).values == before
    done = graph.invoke({"messages": [HumanMessage(content="again", id="h9")]}, cfg("d"))
    assert [m.content for m in done["messages"][-3:]] == ["reply 13", "again", "reply 15"]


# --- every command names LangGraph threads and checkpoints the same way ---


def _lg_ids(graph: Any, thread: str = "agent-1") -> list[str]:
    return [s.config["configurable"]["checkpoint_id"]
            for s in graph.get_state_history(cfg(thread))]


def test_fork_names_the_thread_by_langgraphs_id_and_counts_checkpoints(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "s")
    graph, _ = paused(url)
    history = list(graph.get_state_history(cfg("agent-1")))
    code, out, err = run(capsys, "fork", url, "agent-1", "~2", "agent-2")
    assert code == 0 and "into 'lg:[\"agent-2\",\"\"]'" in out, err
    forked = graph.get_state(cfg("agent-2"))  # LangGraph sees the fork as thread agent-2
    assert forked.config["configurable"]["checkpoint_id"] == _lg_ids(graph)[2]
    assert forked.values == history[2].values
    assert _lg_ids(graph, "agent-2") == _lg_ids(graph)[2:]


def test_rewind_goes_back_n_langgraph_checkpoints_and_keeps_the_target_s_writes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "s")
    graph, _ = paused(url)
    ids = _lg_ids(graph)
    code, out, err = run(capsys, "rewind", url, "agent-1", "~2")
    assert code == 0 and f"now ends at checkpoint {ids[2]}" in out, err
    assert _lg_ids(graph) == ids[2:]
    lgt = lg.read(CheckpointStore.open(url), 'lg:["agent-1",""]')
    assert lgt is not None and set(lgt.writes) <= set(ids[2:])
    assert lgt.writes.get(ids[2])  # the writes of the checkpoint rewound to stay
    graph.invoke(None, cfg("agent-1"))  # and LangGraph goes on from there, to the interrupt
    assert graph.get_state(cfg("agent-1")).interrupts


def test_delete_removes_a_langgraph_checkpoint_with_its_pending_writes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "s")
    graph, _ = paused(url)
    ids = _lg_ids(graph)
    store = CheckpointStore.open(url)
    before = lg.read(store, 'lg:["agent-1",""]')
    assert before is not None and before.writes.get(ids[1])
    code, out, err = run(capsys, "delete", url, "agent-1", "~1")
    assert code == 0 and f"deleted LangGraph checkpoint {ids[1]}" in out, err
    assert _lg_ids(graph) == [ids[0], *ids[2:]]
    after = lg.read(store, 'lg:["agent-1",""]')
    assert after is not None and ids[1] not in after.writes
    assert after.write_count == before.write_count - len(before.writes[ids[1]])


def test_delete_thread_and_export_take_langgraphs_thread_id(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "s")
    graph, _ = paused(url, builder=nested())
    names = CheckpointStore.open(url).threads()
    assert len(names) == 2
    bundle = str(tmp_path / "agent-1.cas")
    code, out, err = run(capsys, "export", url, "agent-1", bundle)
    assert code == 0 and "exported 'lg:[\"agent-1\",\"\"]'" in out, err
    other = str(tmp_path / "t")
    assert run(capsys, "import", other, bundle)[0] == 0
    assert CheckpointStore.open(other).threads() == ['lg:["agent-1",""]']
    code, out, err = run(capsys, "delete-thread", url, "agent-1")
    assert code == 0 and "2 namespaces" in out, err
    assert CheckpointStore.open(url).threads() == []  # every namespace, as LangGraph deletes


def test_search_reads_a_langgraph_thread_at_its_latest_checkpoint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """When the store's head is a pending write (here one a task put after the latest
    checkpoint), search looks at the latest checkpoint, where the messages are."""
    url = str(tmp_path / "s")
    graph, saver = paused(url)
    latest_config = graph.get_state(cfg("agent-1")).config
    saver.put_writes(latest_config, [("notes", "nothing to see")], "task-1")
    store = CheckpointStore.open(url)
    lgt = lg.read(store, 'lg:["agent-1",""]')
    assert lgt is not None and lg.is_write(store.history(lgt.name, limit=1)[0])
    latest = lgt.checkpoints[0].id
    for extra in ([], ["--thread", "agent-1"]):
        got = run_json(capsys, "search", url, "refund policy", *extra)
        assert got["checkpoints_searched"] == 1, extra
        assert len(got["matches"]) == TOOL_CALLS
        assert {m["checkpoint"] for m in got["matches"]} == {latest}
    assert len(run_json(capsys, "search", url, "refund policy", "-n", "2")["matches"]) == 2


def test_stats_tells_checkpoints_and_pending_writes_apart(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "s")
    graph, _ = paused(url)
    lgt = lg.read(CheckpointStore.open(url), 'lg:["agent-1",""]')
    assert lgt is not None
    cps, writes = len(_lg_ids(graph)), lgt.write_count
    code, out, err = run(capsys, "stats", url)
    assert code == 0 and f"1 thread, {cps} checkpoints and {writes} pending writes" in out, err
    got = run_json(capsys, "stats", url)
    assert (got["checkpoints"], got["pending_writes"]) == (cps, writes)


# --- classes the store was not given: shown as their name and data, never imported ---

_SHIPPING = '''
import dataclasses, enum, pathlib, os
pathlib.Path(os.environ["CAS_IMPORT_MARK"]).write_text("imported")

class Speed(enum.Enum):
    FAST = "fast"

@dataclasses.dataclass
class Parcel:
    sku: str
    speed: Speed
'''


def _stand_in_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A CasSaver thread (no types=) whose state holds a pydantic model defined in a function,
    and a dataclass and an enum of a module that marks a file when it is imported."""
    mark = tmp_path / "imported"
    monkeypatch.setenv("CAS_IMPORT_MARK", str(mark))
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "shipping_cas_test.py").write_text(_SHIPPING)
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    import shipping_cas_test as ship

    class Decision(BaseModel):
        ok: bool
        note: str

    class Order(TypedDict):
        parcel: Any
        decision: Any

    def pack(s: Order) -> dict[str, Any]:
        return {"parcel": ship.Parcel("blue-widget", ship.Speed.FAST)}

    def decide(s: Order) -> dict[str, Any]:
        return {"decision": Decision(ok=True, note="approved " + s["parcel"].sku)}

    b = StateGraph(Order)
    b.add_node("pack", pack)
    b.add_node("decide", decide)
    b.add_edge(START, "pack")
    b.add_edge("pack", "decide")
    b.add_edge("decide", END)
    url = str(tmp_path / "s")
    graph = b.compile(checkpointer=CasSaver(CheckpointStore.open(url)))
    graph.invoke({"parcel": None, "decision": None}, cfg("agent-1"))
    mark.unlink()
    return url, mark


def test_stand_ins_show_with_their_class_name_and_are_never_imported(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, mark = _stand_in_thread(tmp_path, monkeypatch)
    got = run_json(capsys, "show", url, "agent-1", "--path", "channel_values")["value"]
    assert got["parcel"] == {"$class": "shipping_cas_test.Parcel",
                             "data": {"sku": "blue-widget", "speed": {
                                 "$class": "shipping_cas_test.Speed", "data": "fast"}}}
    assert got["decision"]["data"] == {"ok": True, "note": "approved blue-widget"}
    assert got["decision"]["$class"].endswith("<locals>.Decision")
    code, out, err = run(capsys, "show", url, "agent-1", "--state-only")
    assert code == 0 and '<shipping_cas_test.Parcel> {' in out and '"sku": "blue-widget"' in out
    assert '<shipping_cas_test.Speed> "fast"' in out, err
    code, out, err = run(capsys, "show", url, "agent-1", "--path",
                         "channel_values.decision.note", "--state-only")
    assert (code, out.strip()) == (0, '"approved blue-widget"'), err
    code, out, err = run(capsys, "log", url, "agent-1")
    assert code == 0 and out.count("checkpoint_id=") == 4, err
    code, out, err = run(capsys, "diff", url, "agent-1~1", "agent-1")
    assert code == 0 and '+ state["channel_values"]["decision"]' in out.replace(
        '~ state["channel_values"]["decision"]', '+ state["channel_values"]["decision"]'), err
    assert "<locals>.Decision>" in out and '"approved blue-widget"' in out
    found = run_json(capsys, "search", url, "approved")["matches"]
    assert [m["path"] for m in found] == ['["channel_values"]["decision"].note']
    code, out, err = run(capsys, "verify", url, "--deep")
    assert code == 0 and "OK" in out, err
    # as in a fresh process, the class's module could be imported (it is on sys.path and not
    # loaded: importing it would run it and mark the file): nothing imports it
    monkeypatch.delitem(sys.modules, "shipping_cas_test")
    for args, shows in ((["show", url, "agent-1"], "<shipping_cas_test.Parcel>"),
                        (["log", url, "agent-1"], "checkpoint_id="),
                        (["diff", url, "agent-1~2", "agent-1"], "<shipping_cas_test.Parcel>"),
                        (["search", url, "widget", "--all-history"], ".sku  blue-widget"),
                        (["show", url, "agent-1", "--types", "langgraph"], "<shipping_cas")):
        code, out, err = run(capsys, *args)
        assert code == 0 and shows in out, (args, err)
    assert not mark.exists() and "shipping_cas_test" not in sys.modules
