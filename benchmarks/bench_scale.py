"""Store-wide operations against the number of threads (issue 31): threads(), iter_threads(),
stats() and gc (first run, nothing changed, 1% changed), verify (quick, deep), on local disk
and on S3 (moto), with S3 requests per thread counted exactly and projected to 1M threads;
LangGraph's SqliteSaver beside on the same threads (its DISTINCT thread query and PRAGMA
quick_check), in the same run.

    python benchmarks/bench_scale.py                           # local 100..50,000, S3 100..5,000
    python benchmarks/bench_scale.py --local 100,1000 --s3 100  # quick
    python benchmarks/bench_scale.py --local 0 --s3 0 --listing 5000,20000  # threads() on S3

``--rounds``: the same listing's requests and rounds counted over refs in memory (pages of
100, so 100,000 refs make 1,000 pages: what 1M refs make on S3).

``--listing``: ``threads()`` on S3 (moto) over that many refs, listed one page after another
(as before issue 31: one ListObjectsV2 paginator) and in key ranges at once
(``backends/ranges.py``), in the same run on the same refs, as moto answers and with
``--latency-ms`` added to each request (moto answers a LIST on this machine in a few ms; S3
takes 30-100 ms).

Each thread holds one checkpoint of a small chat state (5 messages) in its own pack
(``inline_max=1``). gc runs with the default grace (nothing is old enough to delete: the cost
measured is the marking and listing). Prices: S3 Standard us-east-1, GET $0.0004 and
LIST/PUT $0.005 per 1,000 requests.
"""

from __future__ import annotations

import argparse
import contextvars
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import moto_s3, table  # noqa: E402

from cas_checkpoint import CheckpointStore  # noqa: E402
from cas_checkpoint.maintenance import ref_summary  # noqa: E402

GET, LIST = 0.0004 / 1000, 0.005 / 1000  # $ per request
OPS = ["threads()", "iter_threads()", "stats first", "stats unchanged", "gc first",
       "gc unchanged", "gc 1% changed", "stats 1% changed", "verify quick", "verify deep"]


def state(i: int, tag: str = "") -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"message {k} of thread {i}{tag} " * 4}
                         for k in range(5)], "i": i}


def fill(store: CheckpointStore, n: int) -> None:
    store.refs.inline_max = 1
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: store.save(f"thread-{i}", state(i)), range(n)))


def counter(store: CheckpointStore) -> Counter[str]:
    """S3 requests by kind (GET, LIST, PUT, other), counted at s3fs's client call."""
    calls: Counter[str] = Counter()
    fs = store.backend.fs  # type: ignore[attr-defined]
    real = fs._call_s3

    async def counting(method: str, *a: Any, **kw: Any) -> Any:
        kind = {"get_object": "GET", "list_objects_v2": "LIST", "put_object": "PUT"}.get(
            method, "other")
        calls[kind] += 1
        return await real(method, *a, **kw)

    fs._call_s3 = counting
    return calls


def measure(store: CheckpointStore, n: int, calls: Counter[str] | None
            ) -> dict[str, tuple[float, Counter[str]]]:
    out: dict[str, tuple[float, Counter[str]]] = {}

    def one(name: str, fn: Callable[[], Any]) -> None:
        if calls is not None:
            calls.clear()
        t = time.perf_counter()
        fn()
        out[name] = (time.perf_counter() - t, Counter(calls or {}))

    one("threads()", store.threads)
    one("iter_threads()", lambda: sum(1 for _ in store.iter_threads()))
    time.sleep(ref_summary.RACY + 0.5)  # (a local ref written within RACY s is read again)
    one("stats first", store.stats)
    one("stats unchanged", store.stats)
    one("gc first", store.gc)
    one("gc unchanged", store.gc)
    for i in range(0, n, 100):
        store.save(f"thread-{i}", state(i, " changed"))
    time.sleep(ref_summary.RACY + 0.5)
    one("gc 1% changed", store.gc)
    one("stats 1% changed", store.stats)
    one("verify quick", lambda: store.verify(deep=False))
    if n <= 5000:
        one("verify deep", lambda: store.verify(deep=True))
    return out


def sqlite_peer(n: int, folder: str) -> dict[str, float]:
    """SqliteSaver with one checkpoint in each of ``n`` threads: its thread list and checks."""
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = os.path.join(folder, "peer.sqlite")
    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    for i in range(n):
        cp = empty_checkpoint()
        cp["channel_values"] = {"messages": state(i)["messages"]}
        saver.put({"configurable": {"thread_id": f"thread-{i}", "checkpoint_ns": ""}}, cp,
                  {"source": "loop", "step": 0}, {})
    out = {}
    for name, sql in (("threads()", "SELECT DISTINCT thread_id FROM checkpoints"),
                      ("verify quick", "PRAGMA quick_check"),
                      ("verify deep", "PRAGMA integrity_check")):
        t = time.perf_counter()
        conn.execute(sql).fetchall()
        out[name] = time.perf_counter() - t
    conn.close()
    return out


def run_local(sizes: list[int]) -> None:
    rows = []
    for n in sizes:
        folder = tempfile.mkdtemp(prefix="bench-scale-")
        try:
            store = CheckpointStore.open(os.path.join(folder, "store"))
            fill(store, n)
            got = measure(store, n, None)
            peer = sqlite_peer(n, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        for op in OPS:
            if op in got:
                cas = got[op][0] / n * 1e6
                sq = peer.get(op)
                rows.append([n, op, f"{got[op][0] * 1e3:.1f}", f"{cas:.1f}",
                             f"{sq / n * 1e6:.2f}" if sq is not None else "-"])
        print(f"local {n} done", file=sys.stderr, flush=True)
    print("\nLocal disk: time of each store-wide operation (ms) and per thread (µs), "
          "SqliteSaver beside (µs a thread)")
    print(table(["threads", "operation", "ms", "µs/thread", "SqliteSaver µs/thread"], rows))


def run_s3(sizes: list[int]) -> None:
    rows = []
    got_at: dict[int, dict[str, Counter[str]]] = {}
    with moto_s3() as opts:
        for n in sizes:
            store = CheckpointStore.open(f"s3://bench/scale-{n}-{os.getpid()}",
                                         storage_options=opts)
            fill(store, n)
            calls = counter(store)
            got = measure(store, n, calls)
            got_at[n] = {op: c for op, (_, c) in got.items()}
            for op in OPS:
                if op in got:
                    secs, c = got[op]
                    rows.append([n, op, f"{secs * 1e3:.0f}", c["GET"], c["LIST"], c["PUT"],
                                 f"{c['GET'] / n:.3f}", f"{c['LIST'] / n:.4f}"])
            print(f"s3 {n} done", file=sys.stderr, flush=True)
    print("\nS3 (moto): requests of each store-wide operation, and per thread")
    print(table(["threads", "operation", "ms", "GET", "LIST", "PUT", "GET/thread",
                 "LIST/thread"], rows))
    if len(sizes) < 2:
        return
    a, b = sizes[-2], sizes[-1]
    print(f"\nProjected to 1,000,000 threads (one pack each). GET and PUT: the line through the "
          f"runs at {a} and {b} threads. LIST: the listings each operation makes (model "
          "below; a page holds 1,000 keys; gc and verify list packs/00..ff at once), checked "
          f"against the run at {b} threads")
    prows = []
    for op in OPS:
        if op not in got_at[a] or op not in got_at[b]:
            continue
        proj = {}
        for kind in ("GET", "PUT"):
            slope = (got_at[b][op][kind] - got_at[a][op][kind]) / (b - a)
            proj[kind] = max(0.0, got_at[b][op][kind] + slope * (1_000_000 - b))
        proj["LIST"] = lists(op, 1_000_000)
        price = proj["GET"] * GET + (proj["LIST"] + proj["PUT"]) * LIST
        prows.append([op, f"{proj['GET']:,.0f}", f"{proj['LIST']:,.0f}", f"{proj['PUT']:,.0f}",
                      f"${price:.3f}", f"${price * 24 * 30:.0f}",
                      f"{lists(op, b)} / {got_at[b][op]['LIST']}"])
    print(table(["operation", "GET", "LIST", "PUT", "price a run", "hourly, a month",
                 f"LIST model / measured at {b}"], prows))


# LIST requests of each operation: (listings of refs/heads or refs/, listings of packs/ by its
# 256 prefixes at once, listings of packs/ as one paginator, small fixed listings)
LISTINGS = {"threads()": (1, 0, 0, 0), "iter_threads()": (1, 0, 0, 0),
            "stats first": (2, 0, 1, 1), "stats unchanged": (2, 0, 1, 1),
            "stats 1% changed": (2, 0, 1, 1), "gc first": (2, 1, 0, 2),
            "gc unchanged": (2, 1, 0, 2), "gc 1% changed": (2, 1, 0, 2),
            "verify quick": (1, 1, 0, 0), "verify deep": (1, 1, 0, 0)}


def lists(op: str, n: int) -> int:
    refs, by_prefix, whole, fixed = LISTINGS[op]
    pages = -(-n // 1000)  # one pack and one ref a thread
    prefixed = 1 if n < 1000 else 256 * -(-n // (256 * 1000))
    return refs * pages + by_prefix * prefixed + whole * pages + fixed


ROUNDS: contextvars.ContextVar[int] = contextvars.ContextVar("rounds", default=0)


def _listing_times(store: CheckpointStore, n: int, added: float) -> list[list[Any]]:
    """threads() timed both ways with ``added`` ms before each S3 request."""
    import asyncio

    from cas_checkpoint.engine.refs import HEADS

    backend: Any = store.backend
    fs = backend.fs
    real = fs._call_s3
    calls: Counter[str] = Counter()
    deepest = [0]

    async def slow(method: str, *a: Any, **kw: Any) -> Any:
        calls[method] += 1
        # rounds: the longest chain of requests each waiting for the one before (a task
        # inherits its maker's count): what the time is on S3, ~30-100 ms a request
        depth = ROUNDS.get() + 1
        ROUNDS.set(depth)
        deepest[0] = max(deepest[0], depth)
        await asyncio.sleep(added / 1000)
        return await real(method, *a, **kw)

    def before() -> list[str]:  # what threads() did: one paginator, a page after another
        listed = backend._run(backend._list(HEADS))
        return sorted(store._run(store._core.refs.threads_in(listed)))

    rows: list[list[Any]] = []
    fs._call_s3 = slow
    try:
        for how, fn in (("one page after another", before), ("key ranges at once",
                                                             store.threads)):
            calls.clear()
            deepest[0] = 0
            t = time.perf_counter()
            got = fn()
            secs = time.perf_counter() - t
            assert len(got) == n
            rows.append([n, f"+{added:g} ms", how, f"{secs * 1e3:.0f}",
                         f"{secs / n * 1e6:.1f}", calls["list_objects_v2"], deepest[0]])
    finally:
        fs._call_s3 = real
    return rows


def run_listing(sizes: list[int], latency_ms: float) -> None:
    from cas_checkpoint.engine.refs import thread_key

    rows = []
    with moto_s3() as opts:
        for n in sizes:
            store = CheckpointStore.open(f"s3://bench/listing-{n}-{os.getpid()}",
                                         storage_options=opts)
            store.backend.put_many({thread_key(f"tenant-7/thread-{i}"): b"r" for i in range(n)})
            for added in (0.0, latency_ms):
                rows += _listing_times(store, n, added)
            print(f"listing {n} done", file=sys.stderr, flush=True)
    print("\nthreads() on S3 (moto): one page after another (before) and in key ranges at "
          "once (now), the same refs in the same run; a page holds 1,000 keys")
    print(table(["threads", "latency added", "listing", "ms", "µs/thread", "LIST", "rounds"],
                rows))


def run_rounds(n: int, page: int) -> None:
    """The listing's shape without a server: ``n`` refs of three kinds of ids in memory, pages
    of ``page`` keys; requests, the most in flight, and rounds (requests that wait for one
    another), beside one page after another (pages requests in as many rounds)."""
    import asyncio
    import bisect
    import random

    import fsspec

    from cas_checkpoint.backends import ranges
    from cas_checkpoint.backends.memory import MemoryBackend
    from cas_checkpoint.engine.refs import HEADS, thread_key

    class Counted(MemoryBackend):
        def __init__(self, keys: list[str]) -> None:
            super().__init__(fsspec.filesystem("memory"), f"/rounds-{os.getpid()}")
            self.infos = [ranges_info(k) for k in sorted(keys)]
            self.keys = [i.key for i in self.infos]
            self.calls = self.now = self.peak = 0

        async def alist_page(self, prefix: str, start_after: str | None = None,
                             limit: int = 1000) -> tuple[list[Any], bool]:
            depth = ROUNDS.get() + 1
            ROUNDS.set(depth)
            self.deepest = max(getattr(self, "deepest", 0), depth)
            self.calls += 1
            self.now += 1
            self.peak = max(self.peak, self.now)
            await asyncio.sleep(0)
            self.now -= 1
            at = 0 if start_after is None else bisect.bisect_right(self.keys, start_after)
            return self.infos[at:at + limit], len(self.keys) > at + limit

    def ranges_info(key: str) -> Any:
        from cas_checkpoint.backends.base import ObjectInfo

        return ObjectInfo(key, 1, 0.0)

    rng = random.Random(1)
    kinds = {"random hex ids": [f"{rng.getrandbits(128):032x}" for _ in range(n)],
             "tenant-42/agent-<n>": [f"tenant-42/agent-{i * 7919 % 10**8:08d}"
                                     for i in range(n)],
             "thread-<i>": [f"thread-{i}" for i in range(n)]}
    rows = []
    for kind, ids in kinds.items():
        backend = Counted([thread_key(t) for t in ids])

        async def go(b: Counted = backend) -> int:
            return sum([len(p) async for p in ranges.alist_split(b, HEADS, page_size=page)])

        assert asyncio.run(go()) == n
        pages = -(-n // page)
        rows.append([kind, n, pages, backend.calls, backend.peak, backend.deepest, pages])
    print(f"\nThe listing in key ranges, counted: {n} refs in pages of {page}")
    print(table(["ids", "refs", "pages", "requests", "most in flight", "rounds",
                 "rounds one page after another"], rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--local", default="100,1000,5000,20000,50000")
    ap.add_argument("--s3", default="100,1000,5000")
    ap.add_argument("--listing", default="5000,20000")
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--rounds", type=int, default=100_000,
                    help="refs of the counted listing model (0: none), pages of 100")
    args = ap.parse_args()
    local = [int(x) for x in args.local.split(",") if x and int(x)]
    s3 = [int(x) for x in args.s3.split(",") if x and int(x)]
    if local:
        run_local(local)
    if s3:
        run_s3(s3)
    listing = [int(x) for x in args.listing.split(",") if x and int(x)]
    if listing:
        run_listing(listing, args.latency_ms)
    if args.rounds:
        run_rounds(args.rounds, 100)


if __name__ == "__main__":
    main()
