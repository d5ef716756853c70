"""Storage layout v3 (issue 11): requests, rounds and times per save and load, beside LangGraph's
InMemorySaver and SqliteSaver measured in the same run.

States are lists of ~400-byte messages, one message appended per save. LangGraph's savers are
driven through ``put``/``get_tuple`` as LangGraph calls them (a checkpoint whose ``messages``
channel holds the list, its serializer, SqliteSaver on a file in WAL mode).

S3 requests are counted on the store's own botocore client (event hooks ``before-send`` and
``after-call``/``after-call-error`` against a moto server on 127.0.0.1). A *round* is a group of
requests in flight together: a request that starts after every request of the current group has
finished starts a new round. So "2 requests in 1 round" means two requests sent in parallel.

    python benchmarks/bench_layout.py [--sizes 100,1000,10000] [--quick]
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import human, message, moto_s3, table  # noqa: E402

from cas_checkpoint import CheckpointStore, codec  # noqa: E402


class Requests:
    """Counts the S3 requests of one store, and groups them into rounds."""

    def __init__(self, store: CheckpointStore) -> None:
        from fsspec.asyn import sync

        fs = store.backend.fs  # type: ignore[attr-defined]
        sync(fs.loop, fs.set_session)
        self.spans: list[list[float]] = []
        self.ops: list[str] = []
        self.open: dict[int, list[float]] = {}
        events = fs.s3.meta.events
        events.register("before-send.s3", self._start)
        events.register("after-call.s3", self._end)
        events.register("after-call-error.s3", self._end)

    def _start(self, request: Any, event_name: str = "", **_: Any) -> None:
        span = [time.perf_counter(), float("inf")]
        self.spans.append(span)
        self.open.setdefault(id(request.context), []).append(span)
        self.ops.append(event_name.rsplit(".", 1)[-1] or "?")

    def _end(self, context: Any = None, **_: Any) -> None:
        spans = self.open.get(id(context)) if context is not None else None
        now = time.perf_counter()
        if spans:
            spans.pop()[1] = now
        else:  # unmatched: close the oldest open span
            for span in self.spans:
                if span[1] == float("inf"):
                    span[1] = now
                    break

    def reset(self) -> None:
        self.spans.clear()
        self.ops.clear()
        self.open.clear()

    def summary(self) -> tuple[int, int]:
        rounds, end = 0, -1.0
        for start, stop in sorted(self.spans):
            if start >= end:
                rounds += 1
                end = stop
            else:
                end = max(end, stop)
        return len(self.spans), rounds


def states(n: int, seed: int = 1) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [message(i, rng, 400) for i in range(n)]


def grow(store: CheckpointStore, thread: str, msgs: list[dict[str, Any]], n: int) -> None:
    """A thread at n messages: one save per message up to 1,000 (so its history and packs are
    those of a real loop), then the rest in one save and 50 more single appends."""
    direct = n > 1000
    upto = n - 50 if direct else n
    if direct:
        store.save(thread, {"messages": msgs[:upto]})
    else:
        for i in range(1, upto + 1):
            store.save(thread, {"messages": msgs[:i]})
    for i in range(upto + 1, n + 1):
        store.save(thread, {"messages": msgs[:i]})


def s3_section(sizes: list[int]) -> list[list[Any]]:
    rows = []
    with moto_s3() as opts:
        for n in sizes:
            url = f"s3://bench/layout-{n}-{uuid.uuid4().hex[:6]}"
            msgs = states(n + 2)
            writer = CheckpointStore.open(url, storage_options=opts)
            t0 = time.perf_counter()
            grow(writer, "t", msgs, n)
            build_s = time.perf_counter() - t0
            count = Requests(writer)
            writer.save("t", {"messages": msgs[:n + 1]})  # steady: this process knows the head
            count.reset()
            t0 = time.perf_counter()
            writer.save("t", {"messages": msgs[:n + 2]})
            save_ms = (time.perf_counter() - t0) * 1000
            save_req, save_rounds = count.summary()
            cold = CheckpointStore.open(url, storage_options=opts)
            c = Requests(cold)
            t0 = time.perf_counter()
            got = cold.load("t").state
            load_ms = (time.perf_counter() - t0) * 1000
            assert got == {"messages": msgs[:n + 2]}
            load_req, load_rounds = c.summary()
            first = CheckpointStore.open(url, storage_options=opts)
            first.save("warm", {"x": 1})  # the safety probe, once per process
            f = Requests(first)
            t0 = time.perf_counter()
            first.save("whole", {"messages": msgs[:n]})
            first_ms = (time.perf_counter() - t0) * 1000
            first_req, first_rounds = f.summary()
            rows.append([f"{n:,}", f"{save_req} in {save_rounds} ({save_ms:.0f} ms)",
                         f"{load_req} in {load_rounds} ({load_ms:.0f} ms)",
                         f"{first_req} in {first_rounds} ({first_ms:.0f} ms)",
                         f"{build_s:.0f} s" + (" (direct)" if n > 1000 else "")])
    return rows


def s3_gc(saves: int) -> list[Any]:
    with moto_s3() as opts:
        url = f"s3://bench/gc-{uuid.uuid4().hex[:6]}"
        store = CheckpointStore.open(url, storage_options=opts)
        msgs = states(saves // 10 + 1)
        for t in range(10):
            for i in range(1, saves // 10 + 1):
                store.save(f"t{t}", {"messages": msgs[:i]})
        packs = len(store.backend.list("packs"))
        time.sleep(2.2)  # LastModified has a 1-second resolution
        count = Requests(store)
        t0 = time.perf_counter()
        report = store.gc(grace=timedelta(seconds=1))
        seconds = time.perf_counter() - t0
        ops: dict[str, int] = {}
        for op in count.ops:
            ops[op] = ops.get(op, 0) + 1
        return [f"{saves:,} saves, 10 threads", packs, report.deleted_objects,
                ", ".join(f"{k} {v}" for k, v in sorted(ops.items())), f"{seconds:.2f} s"]


# --- local disk and memory:// beside LangGraph -----------------------------------------------


def lg_put(saver: Any, thread: str, msgs: list[dict[str, Any]], k: int) -> Any:
    from langgraph.checkpoint.base import empty_checkpoint

    cp = empty_checkpoint()
    cp["channel_values"] = {"messages": list(msgs)}
    cp["channel_versions"] = {"messages": k + 1}
    cfg = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    return saver.put(cfg, cp, {"source": "loop", "step": k}, {"messages": k + 1})


def lg_get(saver: Any, thread: str) -> Any:
    return saver.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})


def timed(fn: Any, repeat: int) -> float:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1000


def steady(n: int, saver_save: Any, saver_load: Any, k: int = 40) -> tuple[float, float]:
    """Median ms of a save appending one message to an n-message state, and of a load."""
    msgs = states(n + k)
    saver_save(msgs[:n], 0)
    saves, loads = [], []
    for i in range(1, k + 1):
        t0 = time.perf_counter()
        saver_save(msgs[:n + i], i)
        saves.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        saver_load()
        loads.append(time.perf_counter() - t0)
    return statistics.median(saves) * 1000, statistics.median(loads) * 1000


_COLD = """
import sys, time, sqlite3
t0 = time.perf_counter()
if sys.argv[1] == "cas":
    from cas_checkpoint import CheckpointStore
    CheckpointStore.open(sys.argv[2]).load("t")
else:
    from langgraph.checkpoint.sqlite import SqliteSaver
    s = SqliteSaver(sqlite3.connect(sys.argv[2], check_same_thread=False))
    s.get_tuple({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})
print((time.perf_counter() - t0) * 1000)
"""


def cold_ms(kind: str, path: str) -> float:
    out = []
    for _ in range(5):
        proc = subprocess.run([sys.executable, "-c", _COLD, kind, path], capture_output=True,
                              text=True, check=True)
        out.append(float(proc.stdout.strip()))
    return statistics.median(out)


def local_rows(n: int) -> list[list[Any]]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    tmp = tempfile.mkdtemp()
    db = os.path.join(tmp, "lg.sqlite")
    sq = SqliteSaver(sqlite3.connect(db, check_same_thread=False))
    sq_save, sq_load = steady(n, lambda m, k: lg_put(sq, "t", m, k), lambda: lg_get(sq, "t"))
    store = CheckpointStore.open(os.path.join(tmp, "cas"))
    cas_save, cas_load = steady(n, lambda m, k: store.save("t", {"messages": m}),
                                lambda: store.load("t"))
    cas_cold, sq_cold = cold_ms("cas", os.path.join(tmp, "cas")), cold_ms("sqlite", db)
    whole = states(n, seed=9)
    first_cas = timed(lambda: store.save(f"w-{uuid.uuid4().hex}", {"messages": whole}), 5)
    first_sq = timed(lambda: lg_put(sq, f"w-{uuid.uuid4().hex}", whole, 0), 5)
    return [
        [f"local save, {n:,}", f"{cas_save:.2f}", f"{sq_save:.2f}", f"{cas_save / sq_save:.2f}x"],
        [f"local warm load, {n:,}", f"{cas_load:.2f}", f"{sq_load:.2f}",
         f"{cas_load / sq_load:.2f}x"],
        [f"local load in a new process, {n:,}", f"{cas_cold:.1f}", f"{sq_cold:.1f}",
         f"{cas_cold / sq_cold:.2f}x"],
        [f"first save of a whole {n:,}-message state", f"{first_cas:.2f}", f"{first_sq:.2f}",
         f"{first_cas / first_sq:.2f}x"],
    ]


def local_section(sizes: list[int]) -> list[list[Any]]:
    from langgraph.checkpoint.memory import InMemorySaver

    rows = [row for n in sizes for row in local_rows(n)]
    mem = InMemorySaver()
    m_save, m_load = steady(100, lambda m, k: lg_put(mem, "t", m, k), lambda: lg_get(mem, "t"))
    url = f"memory://bench-{uuid.uuid4().hex}"
    store = CheckpointStore.open(url)
    c_save, _ = steady(100, lambda m, k: store.save("t", {"messages": m}), lambda: None)
    c_new = timed(lambda: CheckpointStore.open(url).load("t"), 20)
    rows += [["memory:// save vs InMemorySaver, 100", f"{c_save:.3f}", f"{m_save:.3f}",
              f"{c_save / m_save:.1f}x"],
             ["memory:// load in a new store object, 100", f"{c_new:.3f}", f"{m_load:.3f}",
              f"{c_new / m_load:.1f}x"]]
    return rows


def throughput_section() -> list[list[Any]]:
    rows = []
    for kind in ("str", "bytes"):
        value: Any = (random.randbytes(8 << 20).hex() if kind == "str"
                      else random.randbytes(16 << 20))
        store = CheckpointStore.open(tempfile.mkdtemp())
        ms = timed(lambda v=value, s=store: s.save(f"t-{uuid.uuid4().hex}", {"v": v}), 3)
        rows.append([f"save of a 16 MB {kind} value, local", f"{16 / ms * 1000:.0f} MB/s"])
    script = ("import os,tempfile,tracemalloc;from cas_checkpoint import CheckpointStore,codec;"
              "s={'docs':[os.urandom(50000).hex() for _ in range(1100)]};"
              "n=len(codec.encode(s));st=CheckpointStore.open(tempfile.mkdtemp());"
              "tracemalloc.start();st.save('t',s);print(n,tracemalloc.get_traced_memory()[1])")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True).stdout.split()
    enc, peak = (int(x) for x in out)
    rows.append([f"peak memory saving a {human(enc)} state (traced allocations)",
                 f"{human(peak)} = {peak / enc:.1f}x the encoding"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    args = ap.parse_args()
    sizes = [100, 300] if args.quick else [int(s) for s in args.sizes.split(",")]
    import langgraph.version

    print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}; langgraph "
          f"{getattr(langgraph.version, '__version__', '?')}; message ~400 B encoded "
          f"({len(codec.encode(states(1)[0]))} B)")
    print("\nS3 (moto server on 127.0.0.1): requests in sequential rounds (time on loopback)")
    print(table(["messages", "steady save", "cold load (new store)", "first save, whole state",
                 "building the thread"], s3_section(sizes)))
    print("\nS3 gc")
    print(table(["store", "packs", "deleted", "requests (botocore)", "seconds"],
                [s3_gc(200 if args.quick else 2000)]))
    print("\nlocal disk and memory:// beside LangGraph's savers (median ms)")
    print(table(["operation", "cas_checkpoint", "LangGraph", "ratio"],
                local_section([100] if args.quick else [100, 1000])))
    print("\nbig values")
    print(table(["what", "result"], throughput_section()))


if __name__ == "__main__":
    main()
