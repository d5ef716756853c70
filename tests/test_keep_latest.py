"""Keep-latest at save (issue 34): ``keep_mode="exact"`` (or ``save(..., keep_last=N)``) keeps
a thread's last N checkpoints in every save's own compare-and-swap, no prune pass; the LangGraph
saver's ``shallow=True`` keeps one checkpoint per namespace (``get_state_history`` returns one);
its ``ttl`` expires idle threads as LangGraph's TTL settings say."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from test_langgraph import agent_graph, ask_graph, human

from cas_checkpoint import CheckpointStore, InvalidArgumentError
from cas_checkpoint.integrations.langgraph import CasSaver


def _url() -> str:
    return f"memory://keep-{uuid.uuid4().hex[:8]}"


def _state(i: int) -> dict[str, Any]:
    return {"step": i, "payload": f"state {i} " * 100}


def test_a_1000_step_loop_in_keep_last_1_exact_mode_stores_one_state_after_gc() -> None:
    one = CheckpointStore.open(_url())
    one.save("loop", _state(999))
    exact = CheckpointStore.open(_url(), keep_last=1, keep_mode="exact")
    batch = CheckpointStore.open(_url(), keep_last=1)  # the default mode: pruned in batches
    for i in range(1000):
        exact.save("loop", _state(i))
        batch.save("loop", _state(i))
        assert exact.count("loop") == 1  # after every save, not every few
    assert batch.count("loop") > 1
    for store in (exact, batch):
        store.gc(grace=timedelta(0), repack=True)
    assert exact.stats().checkpoints == 1
    assert exact.load("loop").state == _state(999)
    assert exact.storage_bytes() <= 1.2 * one.storage_bytes()  # about one state, stored
    assert exact.storage_bytes() < batch.storage_bytes()
    assert exact.verify().ok


def test_exact_mode_keeps_labelled_checkpoints_and_a_save_can_ask_for_it() -> None:
    store = CheckpointStore.open(_url(), keep_last=3, keep_mode="exact")
    store.save("t", _state(0), label="start")
    for i in range(1, 20):
        store.save("t", _state(i))
    assert [c.label for c in store.history("t")][-1] == "start"
    assert store.count("t") == 4  # the last 3 and the labelled one
    plain = CheckpointStore.open(_url())  # keep_last per save, on a store without it
    for i in range(20):
        plain.save("a", _state(i), keep_last=2)
        plain.save("b", _state(i))
    assert plain.count("a") == 2 and plain.count("b") == 20
    assert [c.id for c in plain.history("a")][0] == plain.head("a")


def test_keep_mode_and_keep_last_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="keep_mode must be 'batch'.*'exact'"):
        CheckpointStore.open(_url(), keep_last=1, keep_mode="strict")
    with pytest.raises(InvalidArgumentError, match="keep_last"):
        CheckpointStore.open(_url()).save("t", {}, keep_last=-1)


def test_shallow_saver_keeps_one_checkpoint_per_namespace() -> None:
    saver = CasSaver.from_url(_url(), shallow=True)
    deep = CasSaver.from_url(_url())
    config: Any = {"configurable": {"thread_id": "s"}}
    g_shallow, g_deep = agent_graph(4, saver), agent_graph(4, deep)
    for graph in (g_shallow, g_deep):
        graph.invoke(human("go"), config)
        graph.invoke(human("again", "h1"), config)
    assert len(list(g_shallow.get_state_history(config))) == 1
    assert len(list(g_deep.get_state_history(config))) > 3
    assert g_shallow.get_state(config).values == g_deep.get_state(config).values
    # the store holds that one checkpoint; LangGraph's pool may land the pending writes of the
    # step before after it (a save always lands): such a straggler goes with the next save
    entries = list(saver.store.history(next(iter(saver.store.threads()))))
    checkpoints = [e for e in entries if "lg" in e.metadata]
    others = [e for e in entries if "lg" not in e.metadata]
    assert len(checkpoints) == 1, entries
    assert len(others) <= 1 and all("w" in e.metadata for e in others), entries


def test_shallow_saver_resumes_an_interrupt() -> None:
    saver = CasSaver.from_url(_url(), shallow=True)
    graph = ask_graph(saver)
    config: Any = {"configurable": {"thread_id": "ask"}}
    first = graph.invoke(human("refund please"), config)
    assert "__interrupt__" in first
    assert len(list(graph.get_state_history(config))) == 1
    from langgraph.types import Command

    done = graph.invoke(Command(resume="yes"), config)
    assert done["log"][-1] == "use:'yes'"
    assert len(list(graph.get_state_history(config))) == 1


def test_saver_ttl_as_langgraph_says_it() -> None:
    saver = CasSaver.from_url(_url(), ttl={"default_ttl": 1 / 60, "strategy": "delete"})
    assert saver.ttl is not None and saver.ttl.idle_for == timedelta(seconds=1)
    graph = ask_graph(saver)
    graph.invoke(human("a"), {"configurable": {"thread_id": "old"}})
    time.sleep(1.6)  # ("old" is idle for the ttl; no timing asserted)
    graph.invoke(human("b"), {"configurable": {"thread_id": "new"}})
    assert saver.sweep(dry_run=True).expired
    report = saver.sweep()
    assert report.expired and all("old" in name for name in report.expired)
    assert graph.get_state({"configurable": {"thread_id": "old"}}).values == {}
    assert graph.get_state({"configurable": {"thread_id": "new"}}).values
    with pytest.raises(InvalidArgumentError, match="refresh_on_read"):
        CasSaver.from_url(_url(), ttl={"default_ttl": 60, "refresh_on_read": True})
    with pytest.raises(InvalidArgumentError, match="default_ttl"):
        CasSaver.from_url(_url(), ttl={"sweep_interval_minutes": 60})
    with pytest.raises(InvalidArgumentError, match="no ttl"):
        CasSaver.from_url(_url()).sweep()


def test_saver_ttl_sweeps_on_put_after_its_interval() -> None:
    saver = CasSaver.from_url(_url(), ttl=timedelta(seconds=1))
    saver.ttl.sweep_every = timedelta(0)  # type: ignore[union-attr]
    graph = ask_graph(saver)
    graph.invoke(human("a"), {"configurable": {"thread_id": "old"}})
    time.sleep(1.6)
    graph.invoke(human("b"), {"configurable": {"thread_id": "new"}})  # its puts sweep
    assert graph.get_state({"configurable": {"thread_id": "old"}}).values == {}


def test_saver_asweep() -> None:
    import asyncio

    saver = CasSaver.from_url(_url(), ttl=timedelta(seconds=1))
    graph = ask_graph(saver)

    async def go() -> Any:
        await graph.ainvoke(human("a"), {"configurable": {"thread_id": "old"}})
        await asyncio.sleep(1.6)
        return await saver.asweep()

    report = asyncio.run(go())
    assert report.expired and all("old" in name for name in report.expired)
    assert saver.store.threads() == []
