"""A real agent's turn, many turns into a thread: CasSaver beside AsyncSqliteSaver and SqliteSaver,
each (saver, number of turns) in a fresh process, measured in one run (issue 29).

Workload: the shape of a production lead agent (a middleware chain around a scripted model, run
through LangGraph's async API). Its graph is a chain of 15 nodes named like LangChain's agent
middleware hooks (``ContextMiddleware.before_agent``, ..., ``model``, ...,
``TitleMiddleware.after_agent``); one of them, ``memory``, is a compiled subgraph of two nodes
(so each turn also checkpoints a namespace ``memory:<task id>``, new every turn). The state is a
``messages`` list of LangChain messages (``add_messages``) and middleware channels: a todo list
of 5 items (rewritten every 4th turn), a model-call counter, and small dicts (``run_context``,
``usage``, ``memory``). A turn is ``await graph.ainvoke({"messages": [HumanMessage]}, config)``
on one thread: the scripted ``model`` node answers with an ``AIMessage``, so a turn adds two
messages of 128 characters of seeded text (fixed ids; ~260-290 bytes each encoded with their
LangChain fields); the other nodes write small updates or nothing. LangGraph's default
durability ("async") issues the puts and pending writes as concurrent tasks while the next step
runs. SqliteSaver has no async methods: its
rows run the same graph (sync nodes) through ``graph.invoke``. Before the measured turns every
case runs one untimed warm-up turn on another thread (imports, S3's once-per-process probe of
conditional writes); its few KB are in every store's bytes.

Per case (one fresh ``python`` process; the parent only starts them and prints the tables):

* calls per turn: every ``aget_tuple``/``aput``/``aput_writes`` (``get_tuple``/``put``/
  ``put_writes`` for SqliteSaver) counted by wrapping the saver class's methods, the mean per
  measured turn: the graph's shape, the same for every saver (the production agent's turn was
  1 / 21 / 20; this graph's subgraph makes it 2 / 21 / 19);
* turn ms: ``perf_counter`` around each ``ainvoke``: the median over all turns, and over the
  last 10% of turns (what a turn costs at that thread length); write ms: per turn, the time at
  least one put or put_writes was in flight (the union of their intervals, not their sum);
* fsyncs per turn: ``strace -f --seccomp-bpf -e trace=fsync,fdatasync`` around the case's
  process, counting the calls between two markers (``fsync(987654)``) the case makes around its
  turns: every fsync/fdatasync of the process and its threads, SQLite's C-level ones included
  (the ``--fsyncs python`` fallback wraps ``os.fsync``/``os.fdatasync`` before anything is
  imported, so it sees CasSaver's calls but none of SQLite's: its SQLite rows say "-");
* S3 requests per turn: CasSaver on ``s3://`` against a moto server on 127.0.0.1 in a process of
  its own (``_common.moto_s3_process``); every API call of any aiobotocore client in the case's
  process (``AioBaseClient._make_api_call``, so s3fs's sync and async faces alike; a retried
  call counts once) during the measured turns;
* store while running: bytes and files after the last turn (local disk: every file under the
  store's folder, SQLite's ``-wal``/``-shm`` included; S3: every key under the prefix, listed
  with boto3); after gc: CasSaver ``store.gc(grace=0, repack=True)`` (on S3 after a 2.2 s wait,
  LastModified having a 1-second resolution, and ``force=True``), SQLite ``VACUUM``;
* latest state: ``aget_state(config)`` on the saver that ran the turns ("open": the median of
  ``NEW_READS`` reads), and a new saver
  object opened on the same store (a new connection for SQLite) and a new compiled graph,
  timed from the open to the state ("new saver": the median of ``NEW_READS``, each through a
  saver of its own: one read on this shared machine swung 2-5x); history 10 / 100:
  ``aget_state_history(config, limit=n)`` read to the end on the saver that ran the turns;
* S3 requests of the latest state on a new saver: the same calls during the first "new saver"
  read (the open included), each timed: the rounds are the groups of calls that overlap in
  time;
* peak RSS: ``ru_maxrss`` of the case's process after its turns and at its end (moto's process
  not included).

The machine's other work makes absolute times noisy; the ratios within one run are the figures
to read (the last table). Times on S3 are moto's on loopback, not a real region's.

    python benchmarks/bench_agent_app.py [--turns 10,50,200,500]
        [--savers sqlite-async,sqlite,cas-local,cas-s3] [--fsyncs auto|strace|python]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import platform
import random
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    count_fsyncs,
    fsync_marker,
    median,
    moto_s3_process,
    s3_size,
    strace_fsyncs,
    strace_works,
    table,
    tree_size,
    version,
)

SAVERS = ("sqlite-async", "sqlite", "cas-local", "cas-local-sync", "cas-memory", "cas-s3")
NAMES = {"sqlite-async": "AsyncSqliteSaver", "sqlite": "SqliteSaver (sync)",
         "cas-local": "CasSaver local", "cas-local-sync": "CasSaver local (sync)",
         "cas-memory": "CasSaver memory://", "cas-s3": "CasSaver S3 (moto)"}
DEFAULT_SAVERS = "sqlite-async,sqlite,cas-local,cas-s3"
NEW_READS = 5  # latest-state reads through a new saver (each its own): their median is shown
def run_case(saver: str, turns: int, fsyncs: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--case", f"{saver}:{turns}",
               "--out", out, "--fsyncs", fsyncs]
        trace = os.path.join(tmp, "strace.txt")
        if fsyncs == "strace":
            cmd = strace_fsyncs(trace) + cmd
        got = subprocess.run(cmd, capture_output=True, text=True)
        if got.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"case {saver}:{turns} failed (exit {got.returncode}):\n"
                               f"{got.stdout[-3000:]}\n{got.stderr[-3000:]}")
        with open(out) as f:
            res: dict[str, Any] = json.load(f)
        if fsyncs == "strace":
            with open(trace, errors="replace") as f:
                n = count_fsyncs(f.read())
            res["fsyncs"] = None if n is None else n / turns
        return res


# --- the agent's graph --------------------------------------------------------------------------

WORDS = ("agent", "tool", "search", "result", "the", "of", "plan", "step", "query", "answer",
         "document", "found", "next", "call", "user", "todo")


def text(seed: int, size: int = 128) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(size // 4))[:size]


class AgentState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    todos: list[dict[str, Any]]
    model_calls: int
    run_context: dict[str, Any]
    usage: dict[str, Any]
    memory: dict[str, Any]


class MemoryState(TypedDict, total=False):
    memory: dict[str, Any]
    run_context: dict[str, Any]


def turn_of(state: Any) -> int:
    return (len(state.get("messages", ())) - 1) // 2  # the human message is in already


def nothing(state: Any) -> None:
    return None


def context(state: Any) -> dict[str, Any]:
    return {"run_context": {"turn": turn_of(state), "user": "u-1", "locale": "en-GB"}}


def model(state: Any) -> dict[str, Any]:
    t = turn_of(state)
    return {"messages": [AIMessage(content=text(2 * t + 1), id=f"ai-{t:05d}")],
            "model_calls": state.get("model_calls", 0) + 1}


def usage(state: Any) -> dict[str, Any]:
    t = turn_of(state)
    return {"usage": {"input_tokens": 40 * t + 30, "output_tokens": 30, "turn": t}}


def todos(state: Any) -> dict[str, Any] | None:
    t = turn_of(state)
    if t % 4:
        return None
    return {"todos": [{"content": text(1000 + t * 5 + i, 40),
                       "status": ("pending", "in_progress", "completed")[(t + i) % 3]}
                      for i in range(5)]}


def remember(state: Any) -> dict[str, Any]:
    t = turn_of(state)
    return {"memory": {**state.get("memory", {}), "last_turn": t, "topic": text(t, 24)}}


def title(state: Any) -> dict[str, Any] | None:
    if turn_of(state):
        return None
    return {"run_context": {**state.get("run_context", {}), "title": text(7, 30)}}


def recall(state: Any) -> dict[str, Any]:
    return {"memory": {**state.get("memory", {}), "recalled": len(state.get("memory", {}))}}


def store_memory(state: Any) -> dict[str, Any]:
    return {"run_context": {**state.get("run_context", {}), "memory_ok": True}}


CHAIN: list[tuple[str, Callable[[Any], Any] | None]] = [
    ("ContextMiddleware.before_agent", context),
    ("TodoListMiddleware.before_agent", nothing),
    ("memory", None),  # the subgraph
    ("SummarizationMiddleware.before_model", nothing),
    ("ModelCallLimitMiddleware.before_model", nothing),
    ("PIIMiddleware.before_model", nothing),
    ("ContextEditingMiddleware.before_model", nothing),
    ("model", model),
    ("UsageMiddleware.after_model", usage),
    ("ToolCallLimitMiddleware.after_model", nothing),
    ("HumanInTheLoopMiddleware.after_model", nothing),
    ("TodoListMiddleware.after_model", todos),
    ("PIIMiddleware.after_model", nothing),
    ("MemoryMiddleware.after_agent", remember),
    ("TitleMiddleware.after_agent", title),
]


def node(fn: Callable[[Any], Any], asynchronous: bool) -> Any:
    if not asynchronous:
        return fn

    async def run(state: Any) -> Any:
        return fn(state)

    run.__name__ = fn.__name__
    return run


def chain(builder: Any, steps: list[tuple[str, Any]]) -> None:
    prev = START
    for name, what in steps:
        builder.add_node(name, what)
        builder.add_edge(prev, name)
        prev = name
    builder.add_edge(prev, END)


def build_graph(checkpointer: Any, asynchronous: bool) -> Any:
    sub = StateGraph(MemoryState)
    chain(sub, [("recall", node(recall, asynchronous)),
                ("store", node(store_memory, asynchronous))])
    memory = sub.compile()  # inherits the parent's checkpointer: namespace memory:<task id>
    g = StateGraph(AgentState)
    chain(g, [(name, memory if fn is None else node(fn, asynchronous)) for name, fn in CHAIN])
    return g.compile(checkpointer=checkpointer)


def human(t: int) -> dict[str, Any]:
    return {"messages": [HumanMessage(content=text(2 * t), id=f"human-{t:05d}")]}


# --- one case, in its own process -------------------------------------------------------------


class Meter:
    """The saver's calls, their intervals, fsyncs and S3 requests while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self.calls: collections.Counter[str] = collections.Counter()
        self.spans: list[tuple[float, float]] = []
        self.fsyncs = 0
        self.s3: collections.Counter[str] = collections.Counter()
        self.reading = False  # S3 calls of one read are timed too (``rounds``)
        self.read_calls: list[tuple[float, float, str]] = []

    def wrap(self, cls: type, asynchronous: bool) -> None:
        """Counts and times the class's get/put/put_writes (one saver class per process)."""
        names = ({"get": "aget_tuple", "put": "aput", "writes": "aput_writes"} if asynchronous
                 else {"get": "get_tuple", "put": "put", "writes": "put_writes"})
        for label, name in names.items():
            orig = getattr(cls, name)
            if asynchronous:
                async def acounted(saver: Any, *a: Any, _o: Any = orig, _l: str = label,
                                   **k: Any) -> Any:
                    t0 = time.perf_counter()
                    try:
                        return await _o(saver, *a, **k)
                    finally:
                        self._record(_l, t0)

                setattr(cls, name, acounted)
            else:
                def counted(saver: Any, *a: Any, _o: Any = orig, _l: str = label,
                            **k: Any) -> Any:
                    t0 = time.perf_counter()
                    try:
                        return _o(saver, *a, **k)
                    finally:
                        self._record(_l, t0)

                setattr(cls, name, counted)

    def _record(self, label: str, t0: float) -> None:
        if self.on:
            self.calls[label] += 1
            if label != "get":
                self.spans.append((t0, time.perf_counter()))

    def busy(self) -> float:
        """The union of the recorded spans' lengths; clears them."""
        total, end = 0.0, -1.0
        for a, b in sorted(self.spans):
            if b > end:
                total += b - max(a, end)
                end = b
        self.spans.clear()
        return total

    def count_fsyncs(self) -> None:
        """Wraps os.fsync/os.fdatasync, and every alias of them a loaded module holds."""
        for name in ("fsync", "fdatasync"):
            orig = getattr(os, name, None)
            if orig is None:
                continue

            def counted(fd: int, _o: Callable[[int], None] = orig) -> None:
                if self.on:
                    self.fsyncs += 1
                _o(fd)

            for module in [os, *sys.modules.values()]:
                for attr, value in list(getattr(module, "__dict__", {}).items()):
                    if value is orig:
                        setattr(module, attr, counted)

    def count_s3(self) -> None:
        from aiobotocore.client import AioBaseClient  # type: ignore[import-untyped]

        orig = AioBaseClient._make_api_call

        async def counted(client: Any, operation_name: str, api_params: Any) -> Any:
            if self.on:
                self.s3[operation_name] += 1
            t0 = time.perf_counter()
            try:
                return await orig(client, operation_name, api_params)
            finally:
                if self.reading:
                    self.read_calls.append((t0, time.perf_counter(), operation_name))

        AioBaseClient._make_api_call = counted


def rounds(calls: list[tuple[float, float, str]]) -> int:
    """Sequential rounds of these timed calls: groups of calls that overlap in time (a call
    that starts after every call before it ended starts a new round)."""
    out, end = 0, -1.0
    for a, b, _ in sorted(calls):
        if a >= end:
            out += 1
        end = max(end, b)
    return out


def rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


class Store:
    """Where one case's saver keeps its data: open, size, compact."""

    def __init__(self, kind: str, tmp: str, opts: dict[str, Any] | None) -> None:
        self.kind, self.opts = kind, opts
        self.dir = os.path.join(tmp, "store")
        self.url = {"cas-memory": f"memory://agent-{uuid.uuid4().hex[:8]}",
                    "cas-s3": f"s3://bench/agent-{uuid.uuid4().hex[:8]}"}.get(kind, self.dir)
        self.db = os.path.join(self.dir, "agent.sqlite")
        os.makedirs(self.dir) if kind.startswith("sqlite") else None

    @contextlib.asynccontextmanager
    async def aopen(self) -> AsyncIterator[Any]:
        if self.kind == "sqlite-async":
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            async with AsyncSqliteSaver.from_conn_string(self.db) as saver:
                yield saver
            return
        from cas_checkpoint.integrations.langgraph import CasSaver

        async with CasSaver.from_url(self.url, storage_options=self.opts) as cas:
            yield cas

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[Any]:
        if self.kind == "sqlite":
            from langgraph.checkpoint.sqlite import SqliteSaver

            conn = sqlite3.connect(self.db, check_same_thread=False)
            try:
                yield SqliteSaver(conn)
            finally:
                conn.close()
            return
        from cas_checkpoint.integrations.langgraph import CasSaver

        yield CasSaver.from_url(self.url, storage_options=self.opts)

    def size(self) -> tuple[int, int]:
        """(bytes, files) of everything the store holds."""
        if self.kind == "cas-s3":
            assert self.opts is not None
            return s3_size(self.opts, "bench", self.url.split("/", 3)[3] + "/")
        if self.kind == "cas-memory":
            import fsspec

            found = fsspec.filesystem("memory").find(self.url, detail=True)
            return sum(int(v["size"]) for v in found.values()), len(found)
        return tree_size(self.dir)

    def compact(self) -> None:
        if self.kind.startswith("sqlite"):
            conn = sqlite3.connect(self.db)
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.close()
            return
        if self.kind == "cas-s3":  # LastModified has a 1-second resolution
            time.sleep(2.2)
        from cas_checkpoint import CheckpointStore

        CheckpointStore.open(self.url, storage_options=self.opts).gc(
            grace=timedelta(0), repack=True, force=self.kind == "cas-s3")


def config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}, "recursion_limit": 100}


async def turns(store: Store, meter: Meter, n_turns: int, res: dict[str, Any],
                asynchronous: bool) -> None:
    """The warm-up, the measured turns, then the reads (on this saver, then on a new one)."""
    async def call(graph: Any, method: str, *a: Any) -> Any:
        if asynchronous:
            return await getattr(graph, "a" + method)(*a)
        return getattr(graph, method)(*a)

    async def history(graph: Any, limit: int) -> list[Any]:
        if asynchronous:
            return [s async for s in graph.aget_state_history(cfg, limit=limit)]
        return list(graph.get_state_history(cfg, limit=limit))

    cfg = config("agent-thread")
    async with contextlib.AsyncExitStack() as stack:
        saver = await (stack.enter_async_context(store.aopen()) if asynchronous
                       else stack.enter_async_context(store.open()))
        meter.wrap(type(saver), asynchronous)
        graph = build_graph(saver, asynchronous)
        await call(graph, "invoke", human(0), config("warm-up"))
        fsync_marker()
        for t in range(n_turns):
            before = collections.Counter(meter.calls)
            meter.on = True
            t0 = time.perf_counter()
            await call(graph, "invoke", human(t), cfg)
            res["turn_times"].append(time.perf_counter() - t0)
            meter.on = False
            res["write_times"].append(meter.busy())
            res["calls_per_turn"].append([meter.calls[k] - before[k]
                                          for k in ("get", "put", "writes")])
        fsync_marker()
        res["rss_turns"] = rss()
        res["bytes_running"], res["files_running"] = store.size()
        opens = []
        for _ in range(NEW_READS):  # (one read alone swung 1.2-1.5x between runs)
            t0 = time.perf_counter()
            state = await call(graph, "get_state", cfg)
            opens.append(time.perf_counter() - t0)
        res["latest_open"] = median(opens)
        res["messages"] = len(state.values["messages"])
        for n in (10, 100):
            t0 = time.perf_counter()
            got = await history(graph, n)
            res[f"history{n}"] = time.perf_counter() - t0
            assert len(got) == min(n, (len(CHAIN) + 2) * n_turns), (n, len(got))
    news = []
    for i in range(NEW_READS):
        t0 = time.perf_counter()
        meter.reading = i == 0
        async with contextlib.AsyncExitStack() as stack:
            saver2 = await (stack.enter_async_context(store.aopen()) if asynchronous
                            else stack.enter_async_context(store.open()))
            state = await call(graph.copy(update={"checkpointer": saver2}), "get_state", cfg)
            news.append(time.perf_counter() - t0)
            if i == 0:
                meter.reading = False
                res["latest_new_s3"] = [len(meter.read_calls), rounds(meter.read_calls),
                                        dict(collections.Counter(c[2] for c in meter.read_calls))]
            assert len(state.values["messages"]) == res["messages"]
    res["latest_new"], res["latest_new_first"] = median(news), news[0]


def case_main(kind: str, n_turns: int, out: str, fsyncs: str) -> None:
    meter = Meter()
    if fsyncs == "python":
        meter.count_fsyncs()
    res: dict[str, Any] = {"saver": kind, "turns": n_turns, "turn_times": [], "write_times": [],
                           "calls_per_turn": []}
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(
            prefix="bench-agent-case-") as tmp:
        opts = None
        if kind == "cas-s3":
            meter.count_s3()
            opts = stack.enter_context(moto_s3_process())
        store = Store(kind, tmp, opts)
        asyncio.run(turns(store, meter, n_turns, res, kind not in ("sqlite", "cas-local-sync")))
        t0 = time.perf_counter()
        store.compact()
        res["gc_s"] = time.perf_counter() - t0
        res["bytes_gc"], res["files_gc"] = store.size()
    assert res["messages"] == 2 * n_turns, res["messages"]
    times = res["turn_times"]
    last = times[-max(1, n_turns // 10):]
    res.update(turn_median=median(times), turn_last=median(last),
               write_median=median(res["write_times"]), rss_end=rss(),
               calls={k: sum(c[i] for c in res["calls_per_turn"]) / n_turns
                      for i, k in enumerate(("get", "put", "writes"))},
               fsyncs=(meter.fsyncs / n_turns if fsyncs == "python" and kind.startswith("cas")
                       else None),
               s3_per_turn=sum(meter.s3.values()) / n_turns if kind == "cas-s3" else None,
               s3_ops=dict(meter.s3))
    with open(out, "w") as f:
        json.dump(res, f)


# --- the tables -------------------------------------------------------------------------------


def ms(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x * 1000:,.{digits}f}"


def mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e6:,.2f} MB" if n < 1e9 else f"{n / 1e9:,.2f} GB"


def report(results: list[dict[str, Any]]) -> str:
    rows1: list[list[Any]] = []
    rows2: list[list[Any]] = []
    for r in results:
        c = r["calls"]
        rows1.append([NAMES[r["saver"]], r["turns"], r["messages"],
                      f"{c['get']:.1f} / {c['put']:.1f} / {c['writes']:.1f}",
                      ms(r["turn_median"]), ms(r["turn_last"]), ms(r["write_median"]),
                      "-" if r.get("fsyncs") is None else f"{r['fsyncs']:.1f}",
                      "-" if r.get("s3_per_turn") is None else f"{r['s3_per_turn']:.1f}",
                      f"{r['rss_turns'] / 1e6:,.0f} / {r['rss_end'] / 1e6:,.0f}"])
        rows2.append([NAMES[r["saver"]], r["turns"],
                      f"{mb(r['bytes_running'])} ({r['files_running']:,})",
                      f"{mb(r['bytes_gc'])} ({r['files_gc']:,})", f"{r['gc_s']:.2f}",
                      f"{ms(r['latest_open'], 1)} / {ms(r['latest_new'], 1)}",
                      f"{ms(r['history10'], 1)} / {ms(r['history100'], 1)}"])
    out = [table(["saver", "turns", "messages", "calls/turn get/put/writes", "turn ms median",
                  "turn ms last 10%", "write ms/turn", "fsyncs/turn", "S3 req/turn",
                  "peak RSS MB turns / end"], rows1), "",
           table(["saver", "turns", "store while running (files)", "after gc/VACUUM (files)",
                  "gc/VACUUM s", "latest state ms open / new saver", "history 10 / 100 ms"],
                 rows2)]
    base = {r["turns"]: r for r in results if r["saver"] == "sqlite-async"}
    rows3: list[list[Any]] = []
    for r in results:
        b = base.get(r["turns"])
        if b is None or r is b:
            continue

        def x(key: str, r: dict[str, Any] = r, b: dict[str, Any] = b) -> str:
            return "-" if not b[key] or r[key] is None else f"{r[key] / b[key]:.2f}x"

        rows3.append([NAMES[r["saver"]], r["turns"], x("turn_median"), x("turn_last"),
                      x("write_median"), x("bytes_running"), x("bytes_gc"),
                      f"{x('latest_open')} / {x('latest_new')}",
                      f"{x('history10')} / {x('history100')}", x("rss_end")])
    if rows3:
        out += ["", "ratio to AsyncSqliteSaver in the same run (lower is better for the saver):",
                table(["saver", "turns", "turn median", "turn last 10%", "write ms",
                       "store running", "after gc", "latest open / new", "history 10 / 100",
                       "peak RSS"], rows3)]
    for r in results:
        if r.get("s3_ops"):
            out.append(f"{NAMES[r['saver']]}, {r['turns']} turns: S3 API calls per turn: "
                       + ", ".join(f"{op} {n / r['turns']:.1f}"
                                   for op, n in sorted(r["s3_ops"].items()))
                       + f" ({r['s3_per_turn'] / sum(r['calls'][k] for k in ('put', 'writes')):.2f}"
                       " per aput/aput_writes)")
            n, k, ops = r.get("latest_new_s3") or (0, 0, {})
            out.append(f"{NAMES[r['saver']]}, {r['turns']} turns: the latest state on a new saver "
                       f"(opening it included): {n} S3 API calls in {k} sequential rounds ("
                       + ", ".join(f"{op} {m}" for op, m in sorted(ops.items())) + ")")
    return "\n".join(out)


def versions() -> str:
    v = version
    return (f"cas_checkpoint {v('cas_checkpoint')}; langgraph {v('langgraph')}, "
            f"langgraph-checkpoint {v('langgraph-checkpoint')}, langgraph-checkpoint-sqlite "
            f"{v('langgraph-checkpoint-sqlite')}, langchain-core {v('langchain-core')}, "
            f"aiosqlite {v('aiosqlite')}; s3fs {v('s3fs')}, moto {v('moto')}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", default="10,50", help="comma-separated rungs (default 10,50)")
    ap.add_argument("--savers", default=DEFAULT_SAVERS,
                    help=f"comma-separated, of {', '.join(SAVERS)} (default {DEFAULT_SAVERS})")
    ap.add_argument("--fsyncs", default="auto", choices=("auto", "strace", "python"),
                    help="how fsyncs are counted (auto: strace if it works here)")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--case", help=argparse.SUPPRESS)  # saver:turns, run in this process
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        saver, turns = args.case.split(":")
        case_main(saver, int(turns), args.out, args.fsyncs)
        return
    try:
        rungs = [int(t) for t in args.turns.split(",")]
        savers = [s for s in args.savers.split(",") if s]
    except ValueError:
        ap.error("--turns takes numbers separated by commas, e.g. --turns 10,50,200")
    bad = [s for s in savers if s not in SAVERS] + [str(t) for t in rungs if t < 1]
    if bad:
        ap.error(f"unknown --savers or --turns {', '.join(bad)}; --savers takes "
                 f"{', '.join(SAVERS)}, --turns numbers >= 1")
    fsyncs = args.fsyncs
    if fsyncs == "auto":
        fsyncs = "strace" if strace_works() else "python"
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg()[:2])
    except OSError:
        load = "-"
    print(f"machine: {os.cpu_count()} CPUs, {platform.system()} {platform.machine()}; python "
          f"{platform.python_version()}; {versions()}; load average (1, 5 min) {load}")
    print(f"fsyncs counted with {fsyncs}" + ("" if fsyncs == "strace" else
                                             " (Python-level: SQLite's are not seen)"))
    results = []
    for turns in rungs:
        for saver in savers:
            res = run_case(saver, turns, fsyncs)
            print(f"  {NAMES[saver]}, {turns} turns: turn median {ms(res['turn_median'])} ms",
                  flush=True)
            results.append(res)
    print()
    print(report(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
