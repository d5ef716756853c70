"""Structural sharing: bytes stored and bytes written per save, beside baselines, in one run.

Workloads (issue 4):
  A  a 200-step agent loop whose messages list grows by one ~380-byte message per step;
  B  1,000 chat turns of three messages each, with a 2-20 KB tool result every fifth turn;
  C  a state of 10,000 messages receiving one more, in a thread that already holds 10,000
     checkpoints (one per message); also the load latency of its newest checkpoint beside the
     same state stored as one blob.
Baselines: whole state per checkpoint (one blob per save, same codec: its total is the sum of the
encoded states) and, when installed (pip install langgraph langgraph-checkpoint-sqlite),
LangGraph's SqliteSaver running a graph with a messages list (A and B only).

    python benchmarks/bench_sharing.py [--steps-a 200] [--turns-b 1000] [--c 10000]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import human, message, table  # noqa: E402

from cas_checkpoint import CheckpointStore
from cas_checkpoint.format import codec
from cas_checkpoint.tree import build as tree  # noqa: E402


class Counting:
    """Wraps a store's backend and counts the bytes of objects and refs actually written."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store, self.written = store, 0
        backend = store.backend
        put_many, write_ref = backend.put_many, backend.write_ref

        def counted_put(items: dict[str, bytes]) -> None:
            for key, data in items.items():
                if not _exists(backend, key):
                    self.written += len(data)
            put_many(items)

        def counted_ref(key: str, data: bytes, expected: str | None, refresh: Any = None) -> str:
            self.written += len(data)
            return write_ref(key, data, expected, refresh)

        backend.put_many = counted_put  # type: ignore[method-assign]
        backend.write_ref = counted_ref  # type: ignore[method-assign]


def _exists(backend: Any, key: str) -> bool:
    try:
        backend.get(key)
        return True
    except KeyError:
        return False


def stored_bytes(store: CheckpointStore) -> int:
    """Bytes stored after gc (packs that merges replaced are garbage), as SqliteSaver is
    measured after VACUUM."""
    store.gc(grace=timedelta(0))
    return store.storage_bytes()


def node_bytes(store: CheckpointStore) -> int:
    """Bytes of state nodes alone (not records, log segments or heads)."""
    total = 0
    for thread in store.threads():
        ref = store.refs.read(thread)
        assert ref is not None
        view = store.objects.view(ref.head)
        total += sum(len(d) for d in map(view.get, view.ids()) if d[:4] == b"CASN")
    return total


def langgraph_sizes(steps: list[list[dict[str, Any]]]) -> int | None:
    """Bytes of a SqliteSaver database after a graph appends each step's messages."""
    try:
        import sqlite3

        from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, MessagesState, StateGraph
    except ImportError:
        return None

    def to_msg(m: dict[str, Any]) -> Any:
        if m["role"] == "tool":
            return ToolMessage(content=m["content"], tool_call_id=m["id"], id=m["id"])
        cls = HumanMessage if m["role"] == "user" else AIMessage
        return cls(content=m["content"], id=m["id"])

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "lg.sqlite")
        conn = sqlite3.connect(path, check_same_thread=False)
        saver = SqliteSaver(conn)

        after = {}  # messages in the state after step i -> i
        seen = 0
        for i, new in enumerate(steps):
            seen += len(new)
            after[seen] = i

        def agent(state):  # type: ignore[no-untyped-def]  # one step of the loop per call
            i = after.get(len(state["messages"]), len(steps))
            return {"messages": [to_msg(m) for m in steps[i + 1]]} if i + 1 < len(steps) else {}

        def more(state):  # type: ignore[no-untyped-def]
            return "agent" if len(state["messages"]) < total else END

        total = sum(len(s) for s in steps)
        builder = StateGraph(MessagesState)
        builder.add_node("agent", agent)
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", more)
        graph = builder.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "bench"}, "recursion_limit": len(steps) + 10}
        graph.invoke({"messages": [to_msg(m) for m in steps[0]]}, config)
        conn.commit()
        conn.execute("VACUUM")
        conn.close()
        return os.path.getsize(path)


def workload_a(n: int) -> list[list[dict[str, Any]]]:
    rng = random.Random(1)
    return [[message(i, rng, 380)] for i in range(n)]


def workload_b(turns: int) -> list[list[dict[str, Any]]]:
    rng = random.Random(2)
    out, k = [], 0
    for t in range(turns):
        step = []
        for _ in range(3):
            step.append(message(k, rng, rng.randint(120, 600)))
            k += 1
        if t % 5 == 4:
            tool = message(k, rng, rng.randint(2048, 20480))
            tool["role"] = "tool"
            step.append(tool)
            k += 1
        out.append(step)
    return out


def run_growth(name: str, steps: list[list[dict[str, Any]]], with_langgraph: bool
               ) -> list[list[Any]]:
    store = CheckpointStore.open(f"memory://bench-{uuid.uuid4().hex}", compression=COMPRESSION)
    counter = Counting(store)
    state: dict[str, Any] = {"messages": [], "step": 0}
    whole = 0
    last = 0
    t0 = time.perf_counter()
    for i, new in enumerate(steps):
        state["messages"].extend(new)
        state["step"] = i
        before = counter.written
        store.save("thread", state)
        last = counter.written - before
        whole += len(codec.encode(state))
    seconds = time.perf_counter() - t0
    final = len(codec.encode(state))
    total = stored_bytes(store)
    state_bytes = node_bytes(store)
    rows = [[name, "final state (encoded)", human(final), "", ""],
            [name, "cas_checkpoint", human(total), f"{total / final:.2f}x", human(last)],
            [name, "  of which state nodes", human(state_bytes),
             f"{state_bytes / final:.2f}x", ""],
            [name, "whole state per checkpoint", human(whole), f"{whole / final:.1f}x",
             human(final)]]
    if with_langgraph:
        lg = langgraph_sizes(steps)
        rows.append([name, "LangGraph SqliteSaver", human(lg) if lg else "not installed",
                     f"{lg / final:.1f}x" if lg else "", ""])
    print(f"  {name}: {len(steps)} saves in {seconds:.1f} s", file=sys.stderr)
    return rows


COMPRESSION: str | None = None  # the stores' compression (--compression; None: the default)
SPREAD = 200  # appends measured after C's history is built


def run_c(n: int) -> tuple[list[list[Any]], list[list[Any]]]:
    rng = random.Random(3)
    msgs = [message(i, rng, 380) for i in range(n + 1)]
    item_sizes = [len(codec.encode(m)) for m in msgs]
    # the history is built in memory:// (no fsync per save), then copied to a local directory
    store = CheckpointStore.open(f"memory://bench-c-{uuid.uuid4().hex}",
                                 compression=COMPRESSION)
    counter = Counting(store)
    state: dict[str, Any] = {"messages": [], "step": 0}
    t0 = time.perf_counter()
    whole, running = 0, 0
    for i in range(n):
        state["messages"].append(msgs[i])
        state["step"] = i
        store.save("thread", state)
        running += item_sizes[i]
        whole += running + 16  # items + list/dict framing (a few bytes off at most)
        if i % 1000 == 999:
            print(f"  C: {i + 1} checkpoints in {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr)
    # the measured save: one more message; then more, for the spread of that figure
    lasts = []
    for k in range(SPREAD):
        state["messages"].append(msgs[n] if k == 0 else message(n + k, rng, 380))
        state["step"] = n + k
        before = counter.written
        store.save("thread", state)
        lasts.append(counter.written - before)
        if k == 0:
            final = len(codec.encode(state))
            total = stored_bytes(store)
    last = lasts[0]
    spread = sorted(lasts)
    big = sum(1 for b in lasts if b >= 8192)
    print(f"  C: bytes written by {SPREAD} consecutive appends: median "
          f"{statistics.median(spread):.0f}, p90 {spread[int(0.9 * SPREAD)]}, max {spread[-1]}, "
          f"mean {statistics.mean(spread):.0f}; {big} wrote 8 KB or more", file=sys.stderr)

    whole += final
    with tempfile.TemporaryDirectory() as tmp:
        local = CheckpointStore.open(f"{tmp}/cas")
        keys = [i.key for i in store.backend.list("packs")]
        for i in range(0, len(keys), 2000):
            got = store.backend.get_many(keys[i:i + 2000])
            local.backend.put_many({k: v for k, v in got.items() if v is not None})
        for info in store.backend.list("refs"):
            local.backend.write_ref(info.key, store.backend.get(info.key), None)
        # load latency: the newest checkpoint, chunked, vs the same state as one blob
        blob = CheckpointStore.open(f"{tmp}/blob")
        saved = tree.SPLIT_MIN
        tree.SPLIT_MIN = 1 << 62
        try:
            blob.save("thread", state)
        finally:
            tree.SPLIT_MIN = saved
        times: dict[str, list[float]] = {"cas_checkpoint (chunked)": [], "one blob": []}
        for _ in range(15):
            for label, path in (("cas_checkpoint (chunked)", "cas"), ("one blob", "blob")):
                fresh = CheckpointStore.open(f"{tmp}/{path}")  # cold in-process caches
                t = time.perf_counter()
                got_state = fresh.load("thread").state
                times[label].append(time.perf_counter() - t)
                assert got_state == state
        base = statistics.median(times["one blob"])
        lat = [[label, f"{1000 * statistics.median(v):.1f}",
                f"{statistics.median(v) / base:.2f}x"] for label, v in times.items()]
    rows = [["C", "final state (encoded)", human(final), "", ""],
            ["C", "cas_checkpoint", human(total), f"{total / final:.2f}x",
             f"{human(last)} (of {SPREAD} appends: median {human(spread[SPREAD // 2])}, "
             f"p90 {human(spread[int(0.9 * SPREAD)])}, max {human(spread[-1])}, "
             f"{big} of {SPREAD} >= 8 KB)"],
            ["C", "whole state per checkpoint", human(whole), f"{whole / final:.0f}x",
             human(final)]]
    return rows, lat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps-a", type=int, default=200)
    ap.add_argument("--turns-b", type=int, default=1000)
    ap.add_argument("--c", type=int, default=10000, help="messages/checkpoints in C (0: skip)")
    ap.add_argument("--no-langgraph", action="store_true")
    ap.add_argument("--langgraph-b", action="store_true",
                    help="also run SqliteSaver on B (a multi-GB database: slow)")
    ap.add_argument("--compression", default=None,
                    help="the cas stores' compression, e.g. none (default: the store's default)")
    args = ap.parse_args()
    global COMPRESSION
    COMPRESSION = args.compression
    rows = run_growth("A", workload_a(args.steps_a), not args.no_langgraph)
    rows += run_growth("B", workload_b(args.turns_b), args.langgraph_b)
    lat: list[list[Any]] = []
    if args.c:
        c_rows, lat = run_c(args.c)
        rows += c_rows
    print("bytes stored (all objects and refs) and bytes written by the last save")
    print(table(["workload", "store", "total stored", "x final", "last save wrote"], rows))
    if lat:
        print("\nC: load latency of the newest checkpoint (local disk, median of 15), ms")
        print(table(["store", "load ms", "vs one blob"], lat))


if __name__ == "__main__":
    main()
