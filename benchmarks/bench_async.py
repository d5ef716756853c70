"""Many agents at once: AsyncCheckpointStore on one event loop, beside the sync API from a thread
pool and the sync API one save at a time, measured in the same run on S3 (moto server) and on
local disk.

Workload: ``--agents`` agents (64), each its own thread id, each saving ``--saves`` times (50) a
growing state ``{"messages": [...]}`` of ~400-byte messages (``_common.message``; each agent's
own text): its first save holds ``--messages`` (100) messages, each later save one more (the 50th
holds 149). That is 3,200 saves per mode. The messages are made before the clock starts.

Modes, each on its own fresh store (a new S3 prefix on a new moto server, or a new temp dir), so
no two share caches or storage; each store makes one untimed warm-up save to another thread
first (the once-per-process S3 safety probe of conditional writes, thread pools started), and
between modes the s3fs filesystem objects of the mode before are dropped and ``gc.collect()``
runs, so each mode starts on the same heap. The modes run in this order:

* sync one-at-a-time: one ``CheckpointStore``, a single loop doing every save, round-robin over
  the agents (save 1 of every agent, then save 2 of every agent, ...);
* sync pool 8: one ``CheckpointStore`` used from a ``ThreadPoolExecutor(8)``, one job per agent
  (its saves in order);
* async: one event loop, one task per agent, all on ONE ``AsyncCheckpointStore``.

Per mode: wall time from the first save to the last, saves/s, p50 and p99 of one save's latency
(``perf_counter`` around the call; in the async mode that includes the time the task waits for
the loop), this process's CPU time meanwhile (all its threads), and, in the async mode, a
heartbeat task on the same loop that sleeps 1 ms (``asyncio.sleep(0.001)``) in a loop and
records how late it wakes: its max and p99 lateness are "loop blocked". The async mode also
records Python's garbage collections over 1 ms (``gc.callbacks``, cheap): they hold the GIL, so
the output gives the ms of gc inside each of the worst gaps, and the lateness less them. After
each mode, the sum of ``count(thread)`` over the agents' threads must equal agents x saves
(asserted).

Targets (from the issue): async on S3 >= 5x the one-at-a-time throughput; the loop never blocked
longer than 20 ms. The output says whether each was met, with the figure.

S3 is a moto server on 127.0.0.1, by default in a process of its own
(``_common.moto_s3_process``): in a thread of this process (``--moto thread``, ``_common.moto_s3``
as the other benchmarks use) it shares the client's GIL and CPUs, and its in-memory bucket
(moto's backends are global to the process: this benchmark empties them after each mode with
``POST /moto-api/reset``) grows this process's heap, so the client's full garbage collections
take longer. Either way moto is single-process Python (the process's CPU
time is shown beside the client's) and its HTTP server (werkzeug's) closes every connection
after its reply, so each request opens a new TCP connection, in every mode: moto's speed bounds
the S3 figures, which are times on loopback, not a real region's.

``--diagnose`` adds, for the async mode, the loop's longest single callbacks (timed by wrapping
``asyncio.Handle._run``, with the loop thread's CPU time in each), the count of gc-tracked
objects before and after the saves, and the stacks of the loop thread sampled (every 2 ms, from
a watchdog thread) while the heartbeat was overdue by more than 10 ms (the watchdog needs the GIL
to sample, so the samples lean to where the loop thread lets go of it: I/O, os.urandom, thread
switches); it perturbs the timings a little, so the headline run leaves it off.

    python benchmarks/bench_async.py [--agents 64 --saves 50 --messages 100] [--only s3|local]
                                     [--moto process|thread] [--quick] [--diagnose]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import os
import platform
import random
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import message, moto_s3, moto_s3_process, pct, table, version  # noqa: E402

import cas_checkpoint  # noqa: E402
from cas_checkpoint import CheckpointStore
from cas_checkpoint.aio import AsyncCheckpointStore  # noqa: E402
from cas_checkpoint.format import codec  # noqa: E402

Msgs = list[dict[str, Any]]
HEARTBEAT = 0.001  # seconds the heartbeat sleeps
TARGET_SPEEDUP = 5.0
TARGET_BLOCK_MS = 20.0


@dataclass
class Work:
    agents: int
    saves: int
    messages: int
    msgs: list[Msgs]  # per agent: messages + saves - 1 messages

    @property
    def total(self) -> int:
        return self.agents * self.saves

    def thread(self, a: int) -> str:
        return f"agent-{a:03d}"

    def state(self, a: int, k: int) -> dict[str, Any]:
        """Agent ``a``'s state at its save ``k`` (0-based)."""
        return {"messages": self.msgs[a][: self.messages + k]}


def make_work(agents: int, saves: int, messages: int) -> Work:
    msgs = []
    for a in range(agents):
        rng = random.Random(1000 + a)
        msgs.append([message(i, rng, 400) for i in range(messages + saves - 1)])
    return Work(agents, saves, messages, msgs)


SERVER: dict[str, Any] = {}  # "pid": the moto server process of the mode running, if any


def server_cpu() -> float | None:
    """CPU seconds the moto server process has used so far (Linux), or None."""
    pid = SERVER.get("pid")
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class Clock:
    """Wall time, this process's CPU time and the server's CPU time, from now to ``stop()``."""

    def __init__(self) -> None:
        self._server0 = server_cpu()
        self._cpu0 = time.process_time()
        self.t0 = time.perf_counter()
        self.wall = self.cpu = 0.0
        self.server: float | None = None

    def stop(self) -> None:
        self.wall = time.perf_counter() - self.t0
        self.cpu = time.process_time() - self._cpu0
        end = server_cpu()
        if end is not None and self._server0 is not None:
            self.server = end - self._server0


@dataclass
class Result:
    mode: str
    saves: int
    clock: Clock
    latencies: list[float]  # seconds, one per save
    beats: list[tuple[float, float]] = field(default_factory=list)  # async mode: the heartbeat's
    # (lateness s, woke at s since the start)
    gcs: GcPauses | None = None  # async mode
    watch: LoopWatch | None = None  # --diagnose

    @property
    def late(self) -> list[float]:
        return [x for x, _ in self.beats]

    @property
    def worst(self) -> list[tuple[float, float]]:
        return sorted(self.beats, reverse=True)[:5]

    def net(self) -> list[float]:
        """The heartbeat's lateness less the gc pauses inside each gap."""
        gcs = self.gcs
        return [x - (gcs.inside(woke - x - HEARTBEAT, woke) if gcs else 0.0)
                for x, woke in self.beats]

    @property
    def wall(self) -> float:
        return self.clock.wall

    @property
    def rate(self) -> float:
        return self.saves / self.wall


# --- where the loop's time went ------------------------------------------------------------------


class GcPauses:
    """Python's garbage collections over 1 ms while open (``gc.callbacks``; any thread): they
    hold the GIL, so the loop waits them out. Cheap: always on in the async mode."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.pauses: list[tuple[float, float, int, str]] = []  # (s, at s, generation, thread)
        self._start = 0.0

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._gc)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self._gc)
        self.pauses.sort(reverse=True)

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._start = now
        elif now - self._start > 0.001:
            self.pauses.append((now - self._start, self._start - self.t0, info["generation"],
                                threading.current_thread().name))

    def inside(self, start: float, end: float) -> float:
        """Seconds of the pauses overlapping [start, end] (seconds since t0)."""
        return sum(max(0.0, min(end, at + p) - max(start, at)) for p, at, *_ in self.pauses)


# --- diagnosis (--diagnose): the loop's longest callbacks, and what it ran while overdue --------


class LoopWatch:
    """Times every callback the event loop runs (wrapping ``asyncio.Handle._run``) and, from a
    watchdog thread, samples the loop thread's stack whenever the heartbeat is overdue."""

    def __init__(self, loop_thread: int, beat: Callable[[], float], t0: float) -> None:
        self.loop_thread, self.beat, self.t0 = loop_thread, beat, t0
        self.callbacks: list[tuple[float, float, float, str]] = []  # (s, at s, CPU s, what)
        self.stacks: collections.Counter[str] = collections.Counter()
        self.timeline: list[tuple[float, str]] = []  # (at s, stack) of each sample
        self.samples = 0
        self.objects = self.objects_before = 0
        self._stop = threading.Event()
        self._orig: Any = None

    def __enter__(self) -> LoopWatch:
        orig = self._orig = asyncio.Handle._run
        calls = self.callbacks
        t0 = self.t0

        def timed(handle: asyncio.Handle) -> None:
            start, cpu = time.perf_counter(), time.thread_time()
            orig(handle)
            took = time.perf_counter() - start
            if took > 0.002:
                calls.append((took, start - t0, time.thread_time() - cpu, repr(handle)[:150]))

        asyncio.Handle._run = timed  # type: ignore[method-assign,assignment]
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.Handle._run = self._orig  # type: ignore[method-assign]
        self._stop.set()
        self._thread.join()
        self.callbacks.sort(reverse=True)

    def waits(self, over: float) -> int:
        return sum(1 for took, _, cpu, _ in self.callbacks if took > over and cpu < took / 2)

    def _watch(self) -> None:
        while not self._stop.wait(0.002):
            if time.perf_counter() - self.beat() < 0.010 + HEARTBEAT:
                continue
            frame = sys._current_frames().get(self.loop_thread)
            if frame is None:
                continue
            self.samples += 1
            frames = traceback.extract_stack(frame)[-6:]
            stack = " < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}"
                               for f in reversed(frames))
            self.stacks[stack] += 1
            self.timeline.append((time.perf_counter() - self.t0, stack))


# --- the three modes ----------------------------------------------------------------------------


async def _async_mode(url: str, opts: dict[str, Any], work: Work, diagnose: bool) -> Result:
    store = await AsyncCheckpointStore.open(url, storage_options=opts)
    try:
        await store.save("warm-up", {"x": 1})
        latencies: list[float] = []
        late: list[tuple[float, float]] = []
        last = [time.perf_counter()]  # when the heartbeat last woke (for the watchdog)
        stop = False

        async def heartbeat() -> None:
            while not stop:
                before = time.perf_counter()
                await asyncio.sleep(HEARTBEAT)
                now = last[0] = time.perf_counter()
                late.append((now - before - HEARTBEAT, now - t0))

        async def agent(a: int) -> None:
            thread = work.thread(a)
            for k in range(work.saves):
                state = work.state(a, k)
                start = time.perf_counter()
                await store.save(thread, state)
                latencies.append(time.perf_counter() - start)

        objects_before = len(gc.get_objects()) if diagnose else 0
        clock = Clock()
        t0 = last[0] = clock.t0
        watch = (LoopWatch(threading.get_ident(), lambda: last[0], t0) if diagnose
                 else None)
        if watch is not None:
            watch.objects_before = objects_before
        with GcPauses(t0) as gcs, watch or contextlib.nullcontext():
            beat = asyncio.create_task(heartbeat())
            await asyncio.sleep(0)  # the heartbeat is asleep before the agents start
            await asyncio.gather(*(agent(a) for a in range(work.agents)))
            clock.stop()
            stop = True
            await beat
        if watch is not None:
            watch.objects = len(gc.get_objects())
        counts = await asyncio.gather(*(store.count(work.thread(a)) for a in range(work.agents)))
    finally:
        await store.aclose()
    check(work, sum(counts), "async")
    return Result("async", work.total, clock, latencies, late, gcs, watch)


def run_async(url: str, opts: dict[str, Any], work: Work, diagnose: bool) -> Result:
    return asyncio.run(_async_mode(url, opts, work, diagnose))


def run_pool(url: str, opts: dict[str, Any], work: Work) -> Result:
    store = CheckpointStore.open(url, storage_options=opts)
    store.save("warm-up", {"x": 1})
    latencies: list[float] = []

    def job(a: int) -> None:
        thread = work.thread(a)
        for k in range(work.saves):
            state = work.state(a, k)
            start = time.perf_counter()
            store.save(thread, state)
            latencies.append(time.perf_counter() - start)

    with ThreadPoolExecutor(8) as pool:
        clock = Clock()
        for f in [pool.submit(job, a) for a in range(work.agents)]:
            f.result()
        clock.stop()
    check(work, sum(store.count(work.thread(a)) for a in range(work.agents)), "sync pool 8")
    return Result("sync pool 8", work.total, clock, latencies)


def run_serial(url: str, opts: dict[str, Any], work: Work) -> Result:
    store = CheckpointStore.open(url, storage_options=opts)
    store.save("warm-up", {"x": 1})
    latencies: list[float] = []
    clock = Clock()
    for k in range(work.saves):
        for a in range(work.agents):
            state = work.state(a, k)
            start = time.perf_counter()
            store.save(work.thread(a), state)
            latencies.append(time.perf_counter() - start)
    clock.stop()
    check(work, sum(store.count(work.thread(a)) for a in range(work.agents)),
          "sync one-at-a-time")
    return Result("sync one-at-a-time", work.total, clock, latencies)


def fresh_heap() -> None:
    """Between modes: drop the s3fs filesystem objects cached by the mode before (their server
    is gone) and collect, so each mode starts with the same heap (Python's full collections
    take longer as it grows)."""
    s3fs = sys.modules.get("s3fs")
    if s3fs is not None:
        s3fs.S3FileSystem.clear_instance_cache()
    gc.collect()


def check(work: Work, total: int, mode: str) -> None:
    print(f"   {mode}: sum of count(thread) over {work.agents} threads = {total:,} "
          f"(expected {work.total:,})", flush=True)
    assert total == work.total, f"{mode}: {total} checkpoints landed, not {work.total}"


# --- storages -----------------------------------------------------------------------------------


def s3_store(in_process: bool) -> Callable[[], contextlib.AbstractContextManager[
        tuple[str, dict[str, Any]]]]:
    @contextlib.contextmanager
    def fresh() -> Iterator[tuple[str, dict[str, Any]]]:
        """A fresh moto server and a fresh prefix: (url, storage options)."""
        server = moto_s3() if in_process else moto_s3_process(SERVER)
        try:
            with server as opts:
                try:
                    yield f"s3://bench/async-{uuid.uuid4().hex[:8]}", opts
                finally:
                    if in_process:  # moto's backends are global to this process: empty them
                        endpoint = opts["client_kwargs"]["endpoint_url"]
                        urllib.request.urlopen(urllib.request.Request(
                            f"{endpoint}/moto-api/reset", method="POST"), timeout=30).close()
        finally:
            SERVER.clear()

    return fresh


@contextlib.contextmanager
def local_store() -> Iterator[tuple[str, dict[str, Any]]]:
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        yield tmp, {}


def section(name: str, where: Callable[[], contextlib.AbstractContextManager[
        tuple[str, dict[str, Any]]]], work: Work, diagnose: bool) -> dict[str, Result]:
    print(f"\n{name}: running (modes in this order, each on a fresh store)", flush=True)
    results: dict[str, Result] = {}
    runs: dict[str, Callable[[str, dict[str, Any]], Result]] = {
        "serial": lambda url, opts: run_serial(url, opts, work),
        "pool": lambda url, opts: run_pool(url, opts, work),
        "async": lambda url, opts: run_async(url, opts, work, diagnose),
    }
    for key, run in runs.items():
        with where() as (url, opts):
            results[key] = run(url, opts)
        fresh_heap()
    base = results["serial"].rate
    rows = []
    for key in ("async", "pool", "serial"):
        r = results[key]
        ms = [x * 1000 for x in r.latencies]
        block = (f"{max(r.late) * 1000:.1f} (p99 {pct(r.late, 0.99) * 1000:.1f})"
                 if r.late else "-")
        rows.append([r.mode, f"{r.saves:,}", f"{r.wall:.2f}", f"{r.rate:.0f}",
                     f"{pct(ms, 0.5):.1f}", f"{pct(ms, 0.99):.1f}", f"{r.rate / base:.2f}x",
                     block, f"{r.clock.cpu:.1f} ({r.clock.cpu / r.wall:.0%})"]
                    + ([] if r.clock.server is None else
                       [f"{r.clock.server:.1f} ({r.clock.server / r.wall:.0%})"]))
    server = results["serial"].clock.server is not None
    print(table(["mode", "saves", "wall s", "saves/s", "p50 ms", "p99 ms",
                 "vs one-at-a-time", "loop max block ms", "CPU s (of wall)"]
                + (["moto CPU s (of wall)"] if server else []), rows))
    a = results["async"]
    if a.late and a.gcs is not None:
        gcs = a.gcs
        print(f"   async heartbeat: {len(a.late):,} wakes over {a.wall:.1f} s (asleep 1 ms each); "
              f"lateness p50 {pct(a.late, 0.5) * 1000:.2f} ms; the worst gaps (ms of Python gc "
              "pauses inside): "
              + ", ".join(f"{x * 1000:.1f} ms from {woke - x - HEARTBEAT:.2f} s (gc "
                          f"{gcs.inside(woke - x - HEARTBEAT, woke) * 1000:.0f})"
                          for x, woke in a.worst))
        net = a.net()
        longest = ", ".join(f"{p * 1000:.0f} ms (gen {g}, {name})" for p, _, g, name in
                            gcs.pauses[:3])
        print(f"   gc: {len(gcs.pauses)} pauses over 1 ms in the async run, "
              f"{sum(p for p, *_ in gcs.pauses) * 1000:.0f} ms in all, the longest "
              f"{longest or '-'}; lateness less the gc pauses inside: max "
              f"{max(net) * 1000:.1f} ms, p99 {pct(net, 0.99) * 1000:.1f} ms")
    if a.watch is not None:
        diagnosis(a)
    return results


def diagnosis(a: Result) -> None:
    w, gcs = a.watch, a.gcs
    assert w is not None and gcs is not None

    def gc_in(start: float, end: float) -> float:
        """ms of gc pauses (over 1 ms) overlapping [start, end]."""
        return gcs.inside(start, end) * 1000

    print(f"   diagnose: {len(w.callbacks)} loop callbacks over 2 ms; the longest (the loop "
          "thread's CPU ms in it; ms of gc pauses inside):")
    for took, at, cpu, what in w.callbacks[:5]:
        print(f"     {took * 1000:.1f} ms from {at:.2f} s (CPU {cpu * 1000:.1f}, gc "
              f"{gc_in(at, at + took):.0f}): {what}")
    by_cpu = max(w.callbacks, key=lambda c: c[2], default=(0.0, 0.0, 0.0, "-"))
    print(f"   diagnose: the most CPU in one callback: {by_cpu[2] * 1000:.1f} ms (wall "
          f"{by_cpu[0] * 1000:.1f} ms, gc {gc_in(by_cpu[1], by_cpu[1] + by_cpu[0]):.0f} ms): "
          f"{by_cpu[3]}; {w.waits(0.010)} callbacks took > 10 ms of wall with < half of it "
          "on the loop thread's CPU (waiting for the GIL or a CPU)")
    no_gc = [c for c in w.callbacks if gc_in(c[1], c[1] + c[0]) == 0]
    print(f"   diagnose: without a gc pause inside, the longest loop callback took "
          f"{no_gc[0][0] * 1000 if no_gc else 0:.1f} ms (CPU "
          f"{no_gc[0][2] * 1000 if no_gc else 0:.1f} ms; {no_gc[0][3] if no_gc else '-'}); "
          f"objects tracked by gc: {w.objects_before:,} before the saves, {w.objects:,} after "
          "(store open)")
    print(f"   diagnose: {w.samples} stack samples of the loop thread while the heartbeat was "
          "> 10 ms overdue; the most common (innermost first):")
    for stack, n in w.stacks.most_common(6):
        print(f"     {n:4d} x {stack}")
    for late, woke in a.worst[:3]:
        start = woke - late - HEARTBEAT
        during = collections.Counter(st for at, st in w.timeline if start <= at <= woke)
        print(f"   diagnose: the gap of {late * 1000:.1f} ms from {start:.2f} s (gc "
              f"{gc_in(start, woke):.0f} ms): {sum(during.values())} samples")
        for stack, n in during.most_common(3):
            print(f"     {n:4d} x {stack}")


# --- main -------------------------------------------------------------------------------------


def versions() -> str:
    v = version
    return (f"cas_checkpoint {cas_checkpoint.__version__}; s3fs {v('s3fs')}, aiobotocore "
            f"{v('aiobotocore')}, botocore {v('botocore')}, moto {v('moto')}")


def load() -> str:
    """The machine's load (other processes share its CPUs)."""
    try:
        return "load average (1, 5 min) " + ", ".join(f"{x:.2f}" for x in os.getloadavg()[:2])
    except OSError:
        return "load average -"


def verdicts(results: dict[str, dict[str, Result]]) -> list[str]:
    out = []
    if "s3" in results:
        r = results["s3"]
        speed = r["async"].rate / r["serial"].rate
        out.append(f"async on S3 >= {TARGET_SPEEDUP:g}x one-at-a-time: "
                   + (f"MET ({speed:.2f}x)" if speed >= TARGET_SPEEDUP else
                      f"MISSED ({speed:.2f}x: {r['async'].rate:.0f} vs "
                      f"{r['serial'].rate:.0f} saves/s)"))
        moto = r["async"].clock.server
        if moto:
            per = moto / r["async"].saves
            cap = 1 / per
            out.append(f"   moto's server used {per * 1000:.2f} ms of CPU per save in the async "
                       f"run: one CPU (its GIL) caps it at ~{cap:.0f} saves/s = "
                       f"{cap / r['serial'].rate:.1f}x one-at-a-time here, whatever the client")
    for name, r in results.items():
        a = r["async"]
        late = a.late or [0.0]
        block = max(late) * 1000
        label = "S3" if name == "s3" else "local disk"
        worst, woke = a.worst[0] if a.beats else (0.0, 0.0)
        in_gc = a.gcs.inside(woke - worst - HEARTBEAT, woke) * 1000 if a.gcs else 0.0
        out.append(f"loop never blocked > {TARGET_BLOCK_MS:g} ms ({label}): "
                   + (f"MET (max {block:.1f} ms)" if block <= TARGET_BLOCK_MS else
                      f"MISSED (max {block:.1f} ms, {in_gc:.0f} ms of it Python gc; p99 "
                      f"{pct(late, 0.99) * 1000:.1f} ms; less gc pauses: max "
                      f"{max(a.net() or [0.0]) * 1000:.1f} ms)"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--saves", type=int, default=50, help="saves per agent")
    ap.add_argument("--messages", type=int, default=100, help="messages in an agent's first save")
    ap.add_argument("--only", choices=["s3", "local"])
    ap.add_argument("--quick", action="store_true", help="8 agents x 5 saves: a smoke run")
    ap.add_argument("--moto", choices=["process", "thread"], default="process",
                    help="run moto's server in its own process (default) or in a thread of "
                    "this one, as the other benchmarks do")
    ap.add_argument("--diagnose", action="store_true",
                    help="async mode: time loop callbacks, sample the loop's stack when late")
    args = ap.parse_args()
    agents, saves = (8, 5) if args.quick else (args.agents, args.saves)
    t_start = time.perf_counter()
    work = make_work(agents, saves, args.messages)
    print(f"machine: {os.cpu_count()} CPUs, {platform.system()} {platform.machine()}; python "
          f"{platform.python_version()}; {versions()}; {load()}")
    first = codec.encode(work.state(0, 0))
    last = codec.encode(work.state(0, saves - 1))
    print(f"workload: {agents} agents x {saves} saves = {work.total:,} saves per mode; an agent's "
          f"state grows from {args.messages} to {args.messages + saves - 1} messages of "
          f"~{len(codec.encode(work.msgs[0][0]))} B ({len(first) / 1024:.0f} KB to "
          f"{len(last) / 1024:.0f} KB encoded), one message more per save"
          + ("; QUICK run" if args.quick else ""))
    print("CPU s: CPU time of this benchmark process, all its threads"
          + (", moto's server included" if args.moto == "thread" else
             "; moto CPU s: the moto server process's (from /proc), over the same span")
          + ". 100% of wall = one CPU busy.")
    results: dict[str, dict[str, Result]] = {}
    if args.only in (None, "s3"):
        where = ("in a thread of this process (_common.moto_s3)" if args.moto == "thread" else
                 "in a process of its own (_common.moto_s3_process)")
        results["s3"] = section(f"S3: moto server on 127.0.0.1, {where}",
                                s3_store(args.moto == "thread"), work, args.diagnose)
        print("   S3 times are moto's on loopback: moto's server is single-process Python (and "
              "opens a new TCP connection per request) and its speed bounds these figures"
              + (" (here it also shares this process's GIL, CPUs and garbage collections)"
                 if args.moto == "thread" else "")
              + "; a real region adds a round trip (~10-30 ms) per request round, and serves "
              "requests in parallel.")
    if args.only in (None, "local"):
        results["local"] = section("local disk (a temp dir)", local_store, work,
                                   args.diagnose)
    print("\ntargets:")
    for line in verdicts(results):
        print("   " + line)
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s; {load()}")


if __name__ == "__main__":
    main()
