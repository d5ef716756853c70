"""Compression and encryption, measured: stored bytes and save/load times with none / zstd /
zstd + encryption, beside LangGraph's SqliteSaver, in the same run (issue 17).

Two workloads, each on local disk (a fresh temp folder per configuration):

1. **the 200-step loop**: the tool-calling ``StateGraph(MessagesState)`` of
   ``bench_langgraph.py`` (no LLM; an AIMessage with a tool call and a ToolMessage of ~300
   characters per step), one ``invoke`` per saver: CasSaver opened with no compression,
   ``compression="zstd"``, and ``compression="zstd", encryption=Key.generate()``; SqliteSaver.
   Columns: checkpoints, wall s of the invoke and ms per checkpoint, bytes stored (CasSaver:
   ``storage_bytes()`` after ``gc(grace=0)``; SqliteSaver: the database after a WAL checkpoint),
   and a cold load: the median over 5 of ``get_tuple`` of the thread's head by a *new* saver
   (a new store object: nothing cached, every pack read from disk, decompressed, decrypted);
2. **a 10,000-message thread**: a plain ``CheckpointStore`` thread grown by ``--batch`` (100)
   chat messages of ~380 bytes per save up to 10,000 messages (100 saves), and the same states
   ``put`` into SqliteSaver as LangGraph checkpoints. Columns: bytes stored (after
   ``repack`` + ``gc(grace=0)`` for cas_checkpoint), the median save time of the last 10 saves,
   and a cold load of the head (median of 5, each by a new store object / a new saver).

Times are wall clock on this machine (``perf_counter``); run it on a quiet machine. Default run
under 2 minutes on 2 cores; ``--quick`` is a smoke run.

    python benchmarks/bench_compression.py [--steps 200] [--messages 10000] [--quick]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import human, message, table  # noqa: E402
from bench_langgraph import build_graph, sqlite_bytes, text  # noqa: E402
from bench_layout import lg_get, lg_put  # noqa: E402
from langchain_core.messages import HumanMessage  # noqa: E402

from cas_checkpoint import CheckpointStore, Key  # noqa: E402

CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("none", {"compression": "none"}),  # (the default is zstd)
    ("zstd", {"compression": "zstd"}),
    ("zstd + encryption", {"compression": "zstd"}),  # a key is added per run
]


def _kw(name: str, kw: dict[str, Any]) -> dict[str, Any]:
    return {**kw, "encryption": Key.generate()} if "encryption" in name else dict(kw)


def median_of(fn: Callable[[], Any], n: int = 5) -> float:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


# --- 1. the 200-step loop -------------------------------------------------------------------


def loop_rows(steps: int, tmp: str) -> list[list[Any]]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    from cas_checkpoint.integrations.langgraph import CasSaver

    rows = []
    config: dict[str, Any] = {"configurable": {"thread_id": "t1"},
                              "recursion_limit": 2 * steps + 20}
    inp = {"messages": [HumanMessage(content=text(-1), id="human-0")]}
    head = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}

    def invoke(saver: Any) -> tuple[int, float]:
        graph = build_graph(steps, saver)
        t0 = time.perf_counter()
        graph.invoke(inp, config)
        wall = time.perf_counter() - t0
        return len(list(graph.get_state_history(config))), wall

    for name, kw in CONFIGS:
        url = os.path.join(tmp, f"loop-{name.replace(' ', '')}")
        kw = _kw(name, kw)
        saver = CasSaver.from_url(url, **kw)
        n, wall = invoke(saver)
        saver.store.gc(grace=timedelta(0))
        stored = saver.store.storage_bytes()
        load = median_of(lambda url=url, kw=kw: CasSaver.from_url(url, **kw).get_tuple(head))
        rows.append([f"CasSaver, {name}", n, f"{wall:.2f}", f"{wall / n * 1000:.2f}",
                     human(stored), f"{load * 1000:.1f}"])
    db = os.path.join(tmp, "loop.sqlite")
    conn = sqlite3.connect(db, check_same_thread=False)
    n, wall = invoke(SqliteSaver(conn))
    stored = sqlite_bytes(conn, db)
    conn.close()

    def sqlite_load() -> None:
        c = sqlite3.connect(db, check_same_thread=False)
        SqliteSaver(c).get_tuple(head)
        c.close()

    rows.append(["SqliteSaver", n, f"{wall:.2f}", f"{wall / n * 1000:.2f}", human(stored),
                 f"{median_of(sqlite_load) * 1000:.1f}"])
    return rows


# --- 2. a 10,000-message thread -------------------------------------------------------------


def thread_rows(total: int, batch: int, tmp: str) -> list[list[Any]]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    rng = random.Random(7)
    msgs = [message(i, rng) for i in range(total)]
    rows = []
    for name, kw in CONFIGS:
        url = os.path.join(tmp, f"thread-{name.replace(' ', '')}")
        kw = _kw(name, kw)
        store = CheckpointStore.open(url, **kw)
        saves = []
        for end in range(batch, total + 1, batch):
            t0 = time.perf_counter()
            store.save("t", {"messages": msgs[:end]})
            saves.append(time.perf_counter() - t0)
        store.repack()
        store.gc(grace=timedelta(0))
        load = median_of(lambda url=url, kw=kw: CheckpointStore.open(url, **kw).load("t"))
        rows.append([f"cas_checkpoint, {name}", len(saves), human(store.storage_bytes()),
                     f"{statistics.median(saves[-10:]) * 1000:.1f}", f"{load * 1000:.1f}"])
    db = os.path.join(tmp, "thread.sqlite")
    conn = sqlite3.connect(db, check_same_thread=False)
    saver = SqliteSaver(conn)
    saves = []
    for step, end in enumerate(range(batch, total + 1, batch)):
        t0 = time.perf_counter()
        lg_put(saver, "t", msgs[:end], step)
        saves.append(time.perf_counter() - t0)
    stored = sqlite_bytes(conn, db)
    conn.close()

    def sqlite_load() -> None:
        c = sqlite3.connect(db, check_same_thread=False)
        lg_get(SqliteSaver(c), "t")
        c.close()

    rows.append(["SqliteSaver", len(saves), human(stored),
                 f"{statistics.median(saves[-10:]) * 1000:.1f}",
                 f"{median_of(sqlite_load) * 1000:.1f}"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200, help="tool calls of the loop")
    ap.add_argument("--messages", type=int, default=10_000, help="messages of the long thread")
    ap.add_argument("--batch", type=int, default=100, help="messages added per save")
    ap.add_argument("--quick", action="store_true", help="a smoke run (20 steps, 1,000 messages)")
    args = ap.parse_args()
    steps, total = (20, 1000) if args.quick else (args.steps, args.messages)
    try:
        avg = ", ".join(f"{x:.2f}" for x in os.getloadavg()[:2])
    except OSError:
        avg = "-"
    print(f"machine: {os.cpu_count()} CPUs, {platform.system()} {platform.machine()}; python "
          f"{platform.python_version()}; load average (1, 5 min) {avg}")
    tmp = tempfile.mkdtemp(prefix="bench-compression-")
    t0 = time.perf_counter()
    print(f"\n1. the {steps}-step LangGraph loop ({2 * steps + 2} messages), local disk")
    print(table(["saver", "checkpoints", "wall s", "ms/checkpoint", "stored",
                 "cold load ms"], loop_rows(steps, tmp)))
    print(f"\n2. a {total:,}-message thread, {args.batch} messages per save, local disk")
    print(table(["store", "saves", "stored", "save ms (last 10)", "cold load ms"],
                thread_rows(total, args.batch, tmp)))
    print(f"\n(total {time.perf_counter() - t0:.0f} s; stores in {tmp})")


if __name__ == "__main__":
    main()
