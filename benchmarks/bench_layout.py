"""Storage layout v3: requests, rounds and times per save and load, beside LangGraph's
InMemorySaver and SqliteSaver measured in the same run.

Workload: states ``{"messages": [...]}`` of ~400-byte messages (``_common.message``), one message
appended per save. LangGraph's savers are driven through ``put``/``get_tuple`` as LangGraph calls
them: a checkpoint from ``empty_checkpoint()`` whose ``messages`` channel holds the list (with
its channel version, metadata ``{"source": "loop", "step": i}`` and ``new_versions``), their
default serializer, SqliteSaver on ``sqlite3.connect(file, check_same_thread=False)`` (it puts
the file in WAL mode).

1. S3 (moto server on 127.0.0.1): a steady save (the thread holds N messages and this process
   wrote its head; median and max over several saves), the first save of a whole N-message state
   (a new thread; the once-per-process safety probe of conditional writes is made beforehand and
   not counted) and a cold load of the head by a NEW CheckpointStore object (empty caches), plus
   the averages over the saves that built the thread. A thread of more than 1,000 messages is
   built with one save of N-50 messages and then 50 single appends (the output says so).
2. Local disk: steady save and warm load (median of 50) beside SqliteSaver put/get_tuple, a load
   in a new process (timed inside the subprocess around open + load, after the imports; the same
   for a new sqlite3 connection + get_tuple), the first save of a whole state; a worker that
   resumes a thread it did not save (a new store object / sqlite3 connection: load, load
   again, append one message, save).
3. memory:// beside InMemorySaver.
4. Big values (``--big`` runs only this): saves of 16 MiB str / bytes values (distinct ones, so
   nothing is memoised) and loads by a new store object, on local disk, memory://, a zstd store
   and an encrypted store, beside SqliteSaver / InMemorySaver putting and getting a checkpoint
   that holds the same value; and the peak memory of saving a ~110 MB state (tracemalloc and
   ru_maxrss, each in its own subprocess).
5. gc on S3 after 2,000 saves over 10 threads: requests by kind (botocore and gc's own count).

Counting requests. The store's s3fs client (``fs.s3``, an aiobotocore client, shared by store
objects with the same options) gets two botocore handlers: ``before-send.s3`` (an HTTP request is
about to go out; once per attempt, so retries count) records its operation and start time, keyed
by the request's context dict, and ``response-received.s3`` (its reply or error came back; again
once per attempt) records the end time and status. A *round* is a group of requests in flight
together: sorted by start, a request that starts at or after the latest end of the current
group opens a new round. "3 in 2" is three requests in two sequential rounds (two of them were
sent in parallel). ``response-received`` fires once a reply's headers are parsed, before a GET's
body is read; requests sent together by a gather all start before any reply, so they land in one
round. Times are wall-clock ms on loopback: moto's own work, not network latency. On a real
region add one round trip (~10-30 ms) per round.

    python benchmarks/bench_layout.py [--sizes 100,1000,10000] [--quick] [--only local,memory]
        [--big]

``--only`` runs some sections alone (``s3``, ``local``, ``memory``, ``big``, ``gc``; all by
default): ``--only local`` prints section 2 in a few seconds. ``--big`` is ``--only big``.
"""

from __future__ import annotations

import argparse
import collections
import functools
import math
import os
import platform
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import human, message, moto_s3, table, version  # noqa: E402

import cas_checkpoint  # noqa: E402
from cas_checkpoint import CheckpointStore
from cas_checkpoint.format import codec  # noqa: E402
from cas_checkpoint.format.objects import VERSION  # noqa: E402

Msgs = list[dict[str, Any]]


# --- S3 request counting --------------------------------------------------------------------


@dataclass
class Counted:
    requests: int
    rounds: int
    ops: collections.Counter[str]  # "PutObject", "GetObject 404", ...
    unfinished: int = 0


class Requests:
    """Records the S3 requests of one store's client while open (see the module docstring)."""

    def __init__(self, store: CheckpointStore) -> None:
        self.events = store.backend.fs.s3.meta.events  # type: ignore[attr-defined]
        self.spans: list[list[Any]] = []  # [operation, start, end]
        self.open: dict[int, list[Any]] = {}

    def __enter__(self) -> Requests:
        self.events.register("before-send.s3", self._start)
        self.events.register("response-received.s3", self._end)
        return self

    def __exit__(self, *_: object) -> None:
        self.events.unregister("before-send.s3", self._start)
        self.events.unregister("response-received.s3", self._end)

    def _start(self, request: Any = None, event_name: str = "", **_: Any) -> None:
        span = [event_name.rsplit(".", 1)[-1], time.perf_counter(), math.inf]
        self.spans.append(span)
        self.open[id(getattr(request, "context", None))] = span

    def _end(self, context: Any = None, response_dict: Any = None, exception: Any = None,
             **_: Any) -> None:
        span = self.open.pop(id(context), None)
        if span is None:
            return
        span[2] = time.perf_counter()
        status = (response_dict or {}).get("status_code", 0)
        if exception is not None or status >= 300:  # "GetObject 404", "PutObject 412"
            span[0] += f" {status or type(exception).__name__}"

    def take(self) -> Counted:
        spans, self.spans, self.open = self.spans, [], {}
        rounds, end = 0, -math.inf
        for start, stop in sorted((s[1], s[2]) for s in spans):
            if start >= end:
                rounds, end = rounds + 1, stop
            else:
                end = max(end, stop)
        return Counted(len(spans), rounds, collections.Counter(s[0] for s in spans),
                       sum(1 for s in spans if s[2] == math.inf))


def counted(req: Requests, fn: Callable[[], Any]) -> tuple[Counted, float, Any]:
    req.take()
    t0 = time.perf_counter()
    out = fn()
    ms = (time.perf_counter() - t0) * 1000
    return req.take(), ms, out


def kinds(ops: collections.Counter[str], per: int = 1) -> str:
    return ", ".join(f"{k} {v}" if per == 1 else f"{k} {v / per:.2f}"
                     for k, v in sorted(ops.items()))


# --- workloads --------------------------------------------------------------------------------


def states(n: int, seed: int = 1) -> Msgs:
    rng = random.Random(seed)
    return [message(i, rng, 400) for i in range(n)]


def grow(store: CheckpointStore, thread: str, msgs: Msgs, n: int) -> tuple[int, bool]:
    """A thread at n messages: one save per message up to 1,000; past that one save of n-50
    messages, then 50 single appends. Returns (saves, direct)."""
    direct = n > 1000
    start = n - 50 if direct else 1
    if direct:
        store.save(thread, {"messages": msgs[:start]})
    for i in range(start + 1 if direct else 1, n + 1):
        store.save(thread, {"messages": msgs[:i]})
    return (51 if direct else n), direct


def s3_size(opts: dict[str, Any], n: int, k: int) -> tuple[list[list[Any]], str]:
    url = f"s3://bench/layout-{n}-{uuid.uuid4().hex[:6]}"
    msgs = states(n + k)
    writer = CheckpointStore.open(url, storage_options=opts)
    with Requests(writer) as req:
        build, build_ms, (saves, direct) = counted(req, lambda: grow(writer, "t", msgs, n))
        steady = [counted(req, functools.partial(writer.save, "t", {"messages": msgs[:n + i]}))
                  for i in range(1, k + 1)]
    ref = writer.refs.read("t")
    assert ref is not None
    head = ref.head
    colds = []
    for _ in range(3):  # each by a new store object: empty caches
        cold = CheckpointStore.open(url, storage_options=opts)
        with Requests(cold) as req:
            colds.append(counted(req, functools.partial(cold.load, "t")))
    c_load, got = colds[0][0], colds[0][2]
    load_ms = f"{statistics.median(ms for _, ms, _ in colds):.0f} (first {colds[0][1]:.0f})"
    assert got.state == {"messages": msgs[:n + k]}, "the cold load returned another state"
    assert len({(c.requests, c.rounds) for c, _, _ in colds}) == 1, "cold loads differ"
    first = CheckpointStore.open(url, storage_options=opts)
    first.save("probe-warm", {"x": 1})  # the safety probe, once per process
    whole = {"messages": states(n, seed=n + 7)}
    with Requests(first) as req:
        c_first, first_ms, _ = counted(req, lambda: first.save("whole", whole))
    label = f"{n:,}"
    s_req = [c.requests for c, _, _ in steady]
    s_rounds = [c.rounds for c, _, _ in steady]
    s_ops = sum((c.ops for c, _, _ in steady), collections.Counter[str]())
    rows: list[list[Any]] = [
        [label, f"steady save (median, max of {k})",
         f"{statistics.median(s_req):g} (max {max(s_req)})",
         f"{statistics.median(s_rounds):g} (max {max(s_rounds)})",
         f"{statistics.median([ms for _, ms, _ in steady]):.0f}", "per save: " + kinds(s_ops, k)],
        [label, f"building the thread: mean of {saves} saves" + (" (direct)" if direct else ""),
         f"{build.requests / saves:.2f}", f"{build.rounds / saves:.2f}", f"{build_ms / saves:.0f}",
         "per save: " + kinds(build.ops, saves)],
        [label, "cold load (new store object; median of 3)", c_load.requests, c_load.rounds,
         load_ms, kinds(c_load.ops)],
        [label, "first save of the whole state", c_first.requests, c_first.rounds,
         f"{first_ms:.0f}", kinds(c_first.ops)],
    ]
    lost = build.unfinished + c_load.unfinished + c_first.unfinished + sum(
        c.unfinished for c, _, _ in steady)
    note = (f"{label} messages: state {human(len(codec.encode(got.state)))}, head "
            f"{human(len(head.encode()))} naming {len(head.packs)} packs (levels "
            f"{','.join(str(p.level) for p in head.packs) or '-'}; "
            f"{human(sum(p.size for p in head.packs))}) and {len(head.inline)} inline objects; "
            f"built in {build_ms / 1000:.0f} s"
            + (f" by ONE save of {n - 50:,} messages, then 50 appends" if direct else "")
            + (f"; {lost} requests got no reply event" if lost else ""))
    return rows, note


def s3_section(sizes: list[int], k: int) -> tuple[list[list[Any]], list[str]]:
    rows: list[list[Any]] = []
    notes: list[str] = []
    with moto_s3() as opts:
        for n in sizes:
            r, note = s3_size(opts, n, k)
            rows += r
            notes.append(note)
    return rows, notes


def s3_gc(saves: int) -> tuple[list[Any], str]:
    with moto_s3() as opts:
        url = f"s3://bench/gc-{uuid.uuid4().hex[:6]}"
        store = CheckpointStore.open(url, storage_options=opts)
        per = saves // 10
        msgs = states(per)
        t0 = time.perf_counter()
        for t in range(10):
            for i in range(1, per + 1):
                store.save(f"t{t}", {"messages": msgs[:i]})
        build_s = time.perf_counter() - t0
        packs = len(store.backend.list("packs"))
        time.sleep(2.2)  # LastModified has a 1-second resolution
        with Requests(store) as req:
            c, ms, report = counted(req, lambda: store.gc(grace=timedelta(seconds=1)))
        for t in range(10):  # every thread still loads after the sweep
            assert store.load(f"t{t}").state == {"messages": msgs}
        own = ", ".join(f"{k} {v}" for k, v in report.requests.items())
        return ([f"{saves:,} saves, 10 threads", packs, report.reachable_objects,
                 report.deleted_objects, f"{c.requests} in {c.rounds}", kinds(c.ops),
                 f"{ms / 1000:.2f} s"],
                f"gc's own count: {own}; the saves took {build_s:.0f} s "
                f"({build_s / saves * 1000:.1f} ms each)")


# --- local disk and memory:// beside LangGraph -----------------------------------------------


def lg_put(saver: Any, thread: str, msgs: Msgs, step: int) -> Any:
    from langgraph.checkpoint.base import empty_checkpoint

    cp = empty_checkpoint()
    cp["channel_values"] = {"messages": list(msgs)}
    cp["channel_versions"] = {"messages": step + 1}
    cfg = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    return saver.put(cfg, cp, {"source": "loop", "step": step}, {"messages": step + 1})


def lg_get(saver: Any, thread: str) -> Any:
    return saver.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})


def median_ms(fn: Callable[[], Any], repeat: int) -> float:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1000


def steady(n: int, save: Callable[[Msgs, int], Any], load: Callable[[], Any], k: int = 50
           ) -> tuple[float, float]:
    """Median ms of a save appending one message to an n-message state, and of a load."""
    msgs = states(n + k)
    save(msgs[:n], 0)
    saves, loads = [], []
    for i in range(1, k + 1):
        t0 = time.perf_counter()
        save(msgs[:n + i], i)
        saves.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        load()
        loads.append(time.perf_counter() - t0)
    return statistics.median(saves) * 1000, statistics.median(loads) * 1000


_NEW_PROCESS = """
import sqlite3, sys, time
kind, path = sys.argv[1], sys.argv[2]
if kind == "cas":
    from cas_checkpoint import CheckpointStore
    before = set(sys.modules)
    t0 = time.perf_counter()
    got = CheckpointStore.open(path).load("t").state
else:
    from langgraph.checkpoint.sqlite import SqliteSaver
    before = set(sys.modules)
    t0 = time.perf_counter()
    saver = SqliteSaver(sqlite3.connect(path, check_same_thread=False))
    got = saver.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})
    got = got.checkpoint["channel_values"]
ms = (time.perf_counter() - t0) * 1000
new = set(sys.modules) - before
lazy = sorted({m.split(".")[0] for m in new} - set(sys.stdlib_module_names))
print(ms, len(got["messages"]), f"{len(new)}:" + (",".join(lazy) or "-"))
"""


def new_process(kind: str, path: str, n: int, repeat: int = 5) -> tuple[float, float, str]:
    """(ms inside the subprocess around open + load, ms of the whole subprocess, "count:names" of
    the modules that open + load imported: how many, and the non-stdlib top-level packages)."""
    inner, outer, lazy = [], [], ""
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", _NEW_PROCESS, kind, path],
                             capture_output=True, text=True, check=True).stdout.split()
        outer.append((time.perf_counter() - t0) * 1000)
        inner.append(float(out[0]))
        assert int(out[1]) == n, f"{kind} loaded {out[1]} messages, not {n}"
        lazy = out[2]
    return statistics.median(inner), statistics.median(outer), lazy


def row(what: str, cas: float, peer: float, digits: int = 2) -> list[Any]:
    return [what, f"{cas:.{digits}f}", f"{peer:.{digits}f}", f"{cas / peer:.2f}x"]


FIRST = 9  # first saves of a whole state timed, for each saver


def local_rows(n: int, k: int) -> list[list[Any]]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    tmp = tempfile.mkdtemp(prefix="bench-layout-")
    db, root = os.path.join(tmp, "lg.sqlite"), os.path.join(tmp, "cas")
    sq = SqliteSaver(sqlite3.connect(db, check_same_thread=False))
    sq_save, sq_load = steady(n, lambda m, i: lg_put(sq, "t", m, i), lambda: lg_get(sq, "t"), k)
    store = CheckpointStore.open(root)
    cas_save, cas_load = steady(n, lambda m, i: store.save("t", {"messages": m}),
                                lambda: store.load("t"), k)
    cas_new, cas_proc, cas_lazy = new_process("cas", root, n + k)
    sq_new, sq_proc, sq_lazy = new_process("sqlite", db, n + k)
    wholes = iter([states(n, seed=1000 + r) for r in range(2 * FIRST)])  # nothing memoised
    first_cas, first_sq = [], []
    for _ in range(FIRST):  # alternated: a busy spell of the disk hits both
        first_cas.append(median_ms(lambda: store.save(f"w-{uuid.uuid4().hex}",
                                                      {"messages": next(wholes)}), 1))
        first_sq.append(median_ms(lambda: lg_put(sq, f"w-{uuid.uuid4().hex}", next(wholes), 0),
                                  1))
    resumed = resume_rows(n, root, db)
    return [
        row(f"local save, {n:,} messages (median of {k})", cas_save, sq_save),
        row(f"local warm load, {n:,}", cas_load, sq_load),
        row(f"local load in a new process (open + load), {n:,}", cas_new, sq_new, 1),
        [f"  modules open + load imported: count, non-stdlib, {n:,}", cas_lazy, sq_lazy, ""],
        row(f"  whole subprocess (python + imports + load), {n:,}", cas_proc, sq_proc, 0),
        row(f"first save of a whole {n:,}-message state (median of {FIRST})",
            statistics.median(first_cas), statistics.median(first_sq)),
        *resumed,
    ]


RESUME = 9  # resumes timed, for each saver


def resume_rows(n: int, root: str, db: str) -> list[list[Any]]:
    """A worker resuming a thread it did not save, as LangGraph does after a restart: a new
    store object (a new sqlite3 connection) loads the thread's head, loads it again, appends
    one message and saves. Timed: the first load, the second, and the save; the two savers
    alternated, each repeat one message longer."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    msgs = states(n + RESUME, seed=7)
    CheckpointStore.open(root).save("r", {"messages": msgs[:n]})
    lg_put(SqliteSaver(sqlite3.connect(db, check_same_thread=False)), "r", msgs[:n], 0)
    times: dict[str, list[float]] = collections.defaultdict(list)

    def timed(name: str, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args)
        times[name].append((time.perf_counter() - t0) * 1000)
        return out

    for i in range(RESUME):
        store = CheckpointStore.open(root)
        state = timed("cas first", store.load, "r").state
        timed("cas second", store.load, "r")
        state["messages"].append(msgs[n + i])
        timed("cas save", store.save, "r", state)
        sq = SqliteSaver(sqlite3.connect(db, check_same_thread=False))
        got = timed("lg first", lg_get, sq, "r").checkpoint["channel_values"]["messages"]
        timed("lg second", lg_get, sq, "r")
        assert len(got) == n + i == len(state["messages"]) - 1
        got.append(msgs[n + i])
        timed("lg save", lg_put, sq, "r", got, i + 1)
    med = {name: statistics.median(v) for name, v in times.items()}
    return [
        row(f"resume in a new store object / connection: load, {n:,} (median of {RESUME})",
            med["cas first"], med["lg first"]),
        row(f"  second load of that head (one this store object did not save), {n:,}",
            med["cas second"], med["lg second"]),
        row(f"  first save after that load (one message appended), {n:,}", med["cas save"],
            med["lg save"]),
    ]


def memory_rows(k: int) -> list[list[Any]]:
    from langgraph.checkpoint.memory import InMemorySaver

    mem = InMemorySaver()
    m_save, m_load = steady(100, lambda m, i: lg_put(mem, "t", m, i), lambda: lg_get(mem, "t"), k)
    url = f"memory://bench-{uuid.uuid4().hex}"
    store = CheckpointStore.open(url)
    c_save, c_load = steady(100, lambda m, i: store.save("t", {"messages": m}),
                            lambda: store.load("t"), k)
    c_new = median_ms(functools.partial(load_new, url), 20)
    return [row(f"memory:// save vs InMemorySaver.put, 100 (median of {k})", c_save, m_save, 3),
            row("memory:// warm load vs get_tuple, 100", c_load, m_load, 3),
            row("memory:// open a new store object + load vs get_tuple, 100", c_new, m_load, 3)]


# --- big values -------------------------------------------------------------------------------

_PEAK = """
import gc, os, resource, sys, tempfile, time, tracemalloc
from cas_checkpoint import CheckpointStore
from cas_checkpoint.format import codec

def high_water():  # bytes; VmHWM is this process's own (ru_maxrss keeps the parent's across exec)
    try:
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

count, mode = int(sys.argv[1]), sys.argv[2]
state = {"docs": [os.urandom(50_000).hex() for _ in range(count)]}  # 100-KB strings
store = CheckpointStore.open(tempfile.mkdtemp(prefix="bench-peak-"))
store.save("warm", {"x": 1})
gc.collect()
before = high_water()
if mode == "trace":
    tracemalloc.start()
t0 = time.perf_counter()
store.save("t", state)
seconds = time.perf_counter() - t0
peak = tracemalloc.get_traced_memory()[1] if mode == "trace" else 0
grew = high_water() - before
tracemalloc.stop()
print(len(codec.encode(state)), seconds, peak, grew)
"""


def load_new(url: str, **opts: Any) -> Any:
    return CheckpointStore.open(url, **opts).load("t")


def lg_put_value(saver: Any, thread: str, value: Any) -> Any:
    from langgraph.checkpoint.base import empty_checkpoint

    cp = empty_checkpoint()
    cp["channel_values"] = {"v": value}
    cp["channel_versions"] = {"v": 1}
    cfg = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    return saver.put(cfg, cp, {"source": "loop", "step": 0}, {"v": 1})


def _rate(ms: float) -> str:
    return f"{16 / ms * 1000:.0f}"


def big_value_rows(kind: str, repeat: int) -> list[list[Any]]:
    """Saves of distinct 16 MiB values (nothing memoised), and loads of one of them by a new
    store object, in MiB/s (medians), beside SqliteSaver / InMemorySaver with the same value."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.sqlite import SqliteSaver

    from cas_checkpoint import Key

    values: list[Any] = [random.randbytes(8 << 20).hex() if kind == "str"
                         else random.randbytes(16 << 20) for _ in range(repeat)]
    rows = []
    tmp = tempfile.mkdtemp(prefix="bench-big-")
    sq = SqliteSaver(sqlite3.connect(os.path.join(tmp, "lg.sqlite"), check_same_thread=False))
    peers = {"local": sq, "memory://": InMemorySaver()}
    for where, opts in (("local", {}), ("memory://", {}), ("local, zstd", {"compression": "zstd"}),
                        ("local, encrypted", {"encryption": Key.generate()})):
        url = (f"memory://bench-big-{uuid.uuid4().hex}" if where == "memory://"
               else tempfile.mkdtemp(prefix="bench-big-"))
        store = CheckpointStore.open(url, **opts)
        store.save("warm", {"x": 1})
        saves = []
        for value in values:
            t0 = time.perf_counter()
            store.save(f"t-{uuid.uuid4().hex}", {"v": value})
            saves.append(time.perf_counter() - t0)
        store.save("t", {"v": values[0]})
        load = median_ms(functools.partial(load_new, url, **opts), 3)
        peer = peers.get(where)
        if peer is None:
            rows.append([f"16 MiB {kind}, {where}", _rate(statistics.median(saves) * 1000),
                         _rate(load), "", "", ""])
            continue
        peer_saves = []
        for value in values:
            t0 = time.perf_counter()
            lg_put_value(peer, f"t-{uuid.uuid4().hex}", value)
            peer_saves.append(time.perf_counter() - t0)
        peer_save = statistics.median(peer_saves) * 1000
        lg_put_value(peer, "t", values[0])
        peer_load = median_ms(functools.partial(lg_get, peer, "t"), 3)
        rows.append([f"16 MiB {kind}, {where}", _rate(statistics.median(saves) * 1000),
                     _rate(load), _rate(peer_save), _rate(peer_load), type(peer).__name__])
    return rows


def peak_row(count: int) -> list[Any]:
    runs = {}
    for mode in ("rss", "trace"):
        out = subprocess.run([sys.executable, "-c", _PEAK, str(count), mode], capture_output=True,
                             text=True, check=True).stdout.split()
        runs[mode] = (int(out[0]), float(out[1]), int(out[2]), int(out[3]))
    enc, seconds, _, grew = runs["rss"]
    peak = runs["trace"][2]
    return [f"save of a {human(enc)} state ({count:,} x 100-KB strings), local disk",
            f"{enc / seconds / 2**20:.0f} MiB/s; peak RSS grew {human(grew)} = "
            f"{grew / enc:.2f}x the encoding; traced peak {human(peak)} = {peak / enc:.2f}x"]


def big_section(count: int, repeat: int) -> None:
    print("\n4. big values: MiB/s (median of the saves of distinct values; load: a new store "
          "object, median of 3), beside LangGraph's saver given the same value")
    rows = [r for kind in ("str", "bytes") for r in big_value_rows(kind, repeat)]
    print(table(["value, storage", "cas save", "cas load", "peer save", "peer load", "peer"],
                rows))
    print(table(["what", "result"], [peak_row(count)]))


# --- main -------------------------------------------------------------------------------------


def versions() -> str:
    v = version
    return (f"cas_checkpoint {cas_checkpoint.__version__} (format {VERSION}); langgraph "
            f"{v('langgraph')}, langgraph-checkpoint {v('langgraph-checkpoint')}, "
            f"langgraph-checkpoint-sqlite {v('langgraph-checkpoint-sqlite')}; s3fs {v('s3fs')}, "
            f"aiobotocore {v('aiobotocore')}, moto {v('moto')}")


SECTIONS = ("s3", "local", "memory", "big", "gc")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100,1000,10000", help="S3 thread sizes (messages)")
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run (< 60 s)")
    ap.add_argument("--big", action="store_true", help="run section 4 (big values) only")
    ap.add_argument("--only", default=",".join(SECTIONS),
                    help=f"comma-separated sections to run, of {','.join(SECTIONS)} (all)")
    args = ap.parse_args()
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    if only - set(SECTIONS):
        ap.error(f"unknown section(s) {sorted(only - set(SECTIONS))}; choose from {SECTIONS}")
    quick = args.quick
    if args.big:
        print(f"machine: {os.cpu_count()} cores; python {platform.python_version()}; "
              f"{versions()}")
        big_section(200 if quick else 1100, 3 if quick else 5)
        return
    sizes = [100, 300] if quick else [int(s) for s in args.sizes.split(",")]
    t_start = time.perf_counter()
    print(f"machine: {os.cpu_count()} cores, {platform.system()} {platform.machine()}; python "
          f"{platform.python_version()}; {versions()}")
    print(f"message ~400 B ({len(codec.encode(states(1)[0]))} B encoded); one appended per save"
          + ("; QUICK run (small sizes)" if quick else ""))

    if "s3" in only:
        rows, notes = s3_section(sizes, 5 if quick else 20)
        print("\n1. S3, moto server on 127.0.0.1: HTTP requests, sequential rounds, ms on loopback")
        print(table(["messages", "operation", "requests", "rounds", "ms", "requests by kind"],
                    rows))
        for note in notes:
            print("   " + note)

    k = 10 if quick else 50
    if only & {"local", "memory"}:
        print("\n2-3. local disk and memory:// beside LangGraph's savers (median ms; ratio = "
              "cas / LangGraph, < 1 is faster)")
        local = ([r for n in ([100] if quick else [100, 1000]) for r in local_rows(n, k)]
                 if "local" in only else [])
        mem = memory_rows(k) if "memory" in only else []
        print(table(["operation", "cas_checkpoint", "LangGraph", "ratio"], local + mem))

    if "big" in only:
        big_section(200 if quick else 1100, 3 if quick else 5)

    if "gc" in only:
        gc_row, gc_note = s3_gc(200 if quick else 2000)
        print("\n5. gc on S3 (grace 1 s, after a 2.2 s pause: every unnamed pack is old enough)")
        print(table(["store", "packs", "named", "deleted", "requests in rounds",
                     "requests (botocore)", "seconds"], [gc_row]))
        print("   " + gc_note)
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
