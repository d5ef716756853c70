"""A thread no store object of the process has read: where its ``get_tuple`` goes, and the
bound of a design that would keep each thread's newest state whole (one object).

issue 29 asks a cold thread on a warm store object for at most 1.5x SqliteSaver's
``get_tuple``. ``bench_langgraph.py --many`` measures the row; this benchmark says what any
layout of the packs and the tree could still win there. It writes ``--threads`` tool-loop
threads of each ``--steps`` (every message its own: no decode is served from another thread's)
into a CasSaver folder and a SqliteSaver file, then, each in a fresh process that reads every
thread once (one untimed read first), medians of the calling thread's CPU a read:

* **CasSaver**: the real ``get_tuple``, with its parts timed around: the ref and its head,
  the log's newest entries (the cursor: a view of the head's packs), the state's load (packs,
  tree join and decode) and the rest;
* **one object (the bound)**: the same ``get_tuple``, but the newest state comes from one
  zstd blob per thread (read, hashed with BLAKE3, decompressed, decoded by the codec),
  written beforehand from a real load. Nothing else changes, so it is what a "newest state
  kept whole" design could reach at best (it skips the record's fetch too, whose fields the
  log entry carries). It patches ``Steps._load`` in its own process only;
* **SqliteSaver**: ``get_tuple`` on an open connection;
* the decode alone: the codec on the same states' encodings, JsonPlus (SqliteSaver's serde) on
  its stored checkpoints, taking turns, the collector off.

    python benchmarks/bench_read_bound.py [--threads 200] [--steps 25,50] [--rounds 2]

``--steps 25`` gives 52 messages a thread, ``50`` 102.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import table  # noqa: E402

PARTS = ("ref and head", "log entries", "state", "rest")


def _config(k: int) -> Any:
    return {"configurable": {"thread_id": f"c{k}", "checkpoint_ns": ""}}


def _cas(where: str) -> Any:
    from cas_checkpoint.integrations.langgraph import CasSaver

    return CasSaver.from_url(os.path.join(where, "cas"))


def _sqlite(where: str) -> Any:
    from langgraph.checkpoint.sqlite import SqliteSaver

    return SqliteSaver(sqlite3.connect(os.path.join(where, "lg.sqlite"),
                                       check_same_thread=False))


def write(where: str, threads: int, steps: int) -> None:
    from bench_langgraph import build_graph, text
    from langchain_core.messages import HumanMessage

    for saver in (_cas(where), _sqlite(where)):
        for k in range(threads):
            tag = f"c{k} "
            first = HumanMessage(content=tag + text(-1), id=f"{tag}human-0")
            build_graph(steps, saver, tag=tag).invoke(
                {"messages": [first]},
                {"configurable": {"thread_id": f"c{k}"}, "recursion_limit": 2 * steps + 20})


def blobs(where: str, threads: int) -> dict[str, Any]:
    """One zstd blob of each thread's newest state's encoding (from a real load), and an
    index: thread key -> [path, BLAKE3 of the blob, checkpoint id]."""
    import zstandard
    from blake3 import blake3

    from cas_checkpoint.format import codec
    from cas_checkpoint.integrations.langgraph.keys import _key

    saver = _cas(where)
    core = saver._core
    folder = os.path.join(where, "blobs")
    os.makedirs(folder, exist_ok=True)
    compressor = zstandard.ZstdCompressor(level=3)
    index: dict[str, list[Any]] = {}
    sizes = []
    for k in range(threads):
        name = _key(f"c{k}", "")
        cp = saver._run(core.load(name))
        data = codec.encode(cp.state, types=core.types)
        blob = compressor.compress(data)
        path = os.path.join(folder, f"{k}.zst")
        Path(path).write_bytes(blob)
        index[name] = [path, blake3(blob).hexdigest(), cp.id]
        sizes.append((len(data), len(blob)))
    Path(folder, "index.json").write_text(json.dumps(index))
    return {"encoded": statistics.median(a for a, _ in sizes),
            "zstd": statistics.median(b for _, b in sizes)}


def _timed(fn: Callable[..., Generator[Any, Any, Any]], acc: dict[str, float], key: str
           ) -> Callable[..., Generator[Any, Any, Any]]:
    def step(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        start = time.thread_time()
        got = yield from fn(*args, **kwargs)
        acc[key] += time.thread_time() - start
        return got

    return step


def _one_object(where: str) -> None:
    """Serve the newest state of each thread from its blob (this process only)."""
    import zstandard
    from blake3 import blake3

    from cas_checkpoint.format import codec
    from cas_checkpoint.integrations.langgraph.steps import Steps

    index = json.loads(Path(where, "blobs", "index.json").read_text())
    decompressor = zstandard.ZstdDecompressor()
    real = Steps._load

    def load(self: Any, name: str, head: Any, ids: list[str], recent: bool = False
             ) -> Generator[Any, Any, dict[str, Any]]:
        got = index.get(name)
        if got is None or head is None or ids != [head.head] or head.head != got[2]:
            return (yield from real(self, name, head, ids, recent))  # type: ignore[arg-type]
        with open(got[0], "rb") as f:
            blob = f.read()
        if blake3(blob).hexdigest() != got[1]:
            raise RuntimeError(f"blob of {name} damaged")
        return {ids[0]: codec.decode(decompressor.decompress(blob), types=self._core.types)}

    Steps._load = load  # type: ignore[assignment, method-assign]


def read(kind: str, where: str, threads: int) -> dict[str, Any]:
    """Every thread's ``get_tuple`` once, in this fresh process; CPU a read, and its parts."""
    acc = dict.fromkeys(PARTS, 0.0)
    if kind == "sqlite":
        saver = _sqlite(where)
    else:
        if kind == "one object":
            _one_object(where)
        from cas_checkpoint.integrations.langgraph.steps import Steps

        saver = _cas(where)
        core = saver._core
        core.ref = _timed(core.ref, acc, "ref and head")
        core.refs.newest_first = _timed(core.refs.newest_first, acc, "log entries")
        Steps._load = _timed(Steps._load, acc, "state")  # type: ignore[method-assign]
    saver.get_tuple(_config(0))
    acc.update(dict.fromkeys(PARTS, 0.0))
    gc.collect()
    cpu = []
    for k in range(1, threads):
        start = time.thread_time()
        got = saver.get_tuple(_config(k))
        cpu.append(time.thread_time() - start)
        assert got is not None
    n = len(cpu)
    acc["rest"] = sum(cpu) - sum(acc[p] for p in PARTS[:3])
    messages = len(got.checkpoint["channel_values"]["messages"])
    return {"cpu": statistics.median(cpu), "parts": {p: acc[p] / n for p in PARTS},
            "messages": messages}


def decode(where: str, threads: int) -> dict[str, float]:
    """The codec on each thread's newest state's encoding, JsonPlus on SqliteSaver's stored
    checkpoint of the same state, taking turns, the collector off."""
    import zstandard
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from cas_checkpoint.format import codec

    types = _cas(where)._core.types
    index = json.loads(Path(where, "blobs", "index.json").read_text())
    decompressor = zstandard.ZstdDecompressor()
    ours = {name: decompressor.decompress(Path(p).read_bytes()) for name, (p, _, _) in
            index.items()}
    con = sqlite3.connect(os.path.join(where, "lg.sqlite"))
    rows = con.execute("SELECT thread_id, type, checkpoint FROM checkpoints WHERE "
                       "checkpoint_ns = '' ORDER BY thread_id, checkpoint_id").fetchall()
    theirs = {t: (ty, cp) for t, ty, cp in rows}  # (the last of each thread: its newest)
    serde = JsonPlusSerializer()
    a, b = [], []
    gc.disable()
    for data, typed in zip(ours.values(), theirs.values(), strict=False):
        start = time.thread_time()
        codec.decode(data, types=types)
        a.append(time.thread_time() - start)
        start = time.thread_time()
        serde.loads_typed(typed)
        b.append(time.thread_time() - start)
    gc.enable()
    return {"codec": statistics.median(a), "jsonplus": statistics.median(b)}


def serve(args: list[str], modes: dict[str, Callable[[str, int, int], Any]],
          read: Callable[[str, str, int], Any]) -> None:
    """A child's work (``--child mode where threads steps``): ``modes[mode](where, threads,
    steps)``, else ``read(mode, where, threads)``; its answer printed as JSON."""
    mode, where, threads, steps = args[0], args[1], int(args[2]), int(args[3])
    do = modes.get(mode)
    print(json.dumps(read(mode, where, threads) if do is None else do(where, threads, steps)))


def _written(where: str, threads: int, steps: int) -> Any:
    write(where, threads, steps)
    return blobs(where, threads)


def child(args: list[str]) -> None:
    serve(args, {"write": _written, "decode": lambda where, threads, _: decode(where, threads)},
          read)


def run_child(script: str, mode: str, where: str, threads: int, steps: int) -> Any:
    """``script --child mode where threads steps`` in a fresh process: its last line's JSON."""
    got = subprocess.run([sys.executable, script, "--child", mode, where, str(threads),
                          str(steps)], check=True, capture_output=True, text=True)
    return json.loads(got.stdout.strip().splitlines()[-1])


def rounds_of(script: str, modes: Sequence[str], threads: int, steps: int, rounds: int
              ) -> tuple[Any, dict[str, list[Any]]]:
    """A store of ``threads`` threads of ``steps`` written by ``script``'s child ``write``,
    then each mode read ``rounds`` times, each in a fresh process: (write's answer, answers
    by mode)."""
    with tempfile.TemporaryDirectory() as where:
        size = run_child(script, "write", where, threads, steps)
        got: dict[str, list[Any]] = {mode: [] for mode in modes}
        for _ in range(rounds):
            for mode in modes:
                got[mode].append(run_child(script, mode, where, threads, steps))
    return size, got


def parser(doc: str, threads: int) -> argparse.ArgumentParser:
    """The options both bound benchmarks take."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=threads)
    ap.add_argument("--steps", default="25,50")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    return ap


def parsed(ap: argparse.ArgumentParser, child: Callable[[list[str]], None]
           ) -> argparse.Namespace | None:
    """The options, checked; None once ``child`` has done a child's work (``--child``)."""
    ns = ap.parse_args()
    if ns.child:
        child(ns.child)
        return None
    if ns.threads < 2:
        ap.error("--threads must be at least 2 (one read is untimed)")
    return ns


def main() -> None:
    ap = parser(__doc__ or "", 200)
    ns = parsed(ap, child)
    if ns is None:
        return
    try:
        steps = [int(s) for s in ns.steps.split(",")]
    except ValueError:
        ap.error(f"--steps takes comma-separated step counts, not {ns.steps!r}")
    print(f"load average {os.getloadavg()[0]:.1f}; {ns.threads} threads a size, "
          f"{ns.rounds} rounds; CPU medians of the calling thread, ms a read")
    rows, parts = [], []
    for n in steps:
        size, got = rounds_of(__file__, ("cas", "one object", "sqlite", "decode"), ns.threads,
                              n, ns.rounds)
        sq = statistics.median(r["cpu"] for r in got["sqlite"])
        msgs = got["cas"][0]["messages"]
        for mode, label in (("cas", "CasSaver, never read"), ("one object", "one object (bound)"),
                            ("sqlite", "SqliteSaver")):
            cpu = statistics.median(r["cpu"] for r in got[mode])
            rows.append([msgs, label, f"{cpu * 1000:.3f}", f"{cpu / sq:.2f}x"])
            if mode != "sqlite":
                parts.append([msgs, label] + [
                    f"{statistics.median(r['parts'][p] for r in got[mode]) * 1000:.3f}"
                    for p in PARTS])
        codec_ms = statistics.median(r["codec"] for r in got["decode"]) * 1000
        jp_ms = statistics.median(r["jsonplus"] for r in got["decode"]) * 1000
        rows.append([msgs, "decode alone: codec / JsonPlus", f"{codec_ms:.3f} / {jp_ms:.3f}",
                     f"{codec_ms / jp_ms:.2f}x"])
        rows.append([msgs, "state encoded / zstd bytes", f"{size['encoded']:.0f} / "
                     f"{size['zstd']:.0f}", ""])
    print(table(["messages", "read", "ms CPU", "x SqliteSaver"], rows))
    print()
    print("the parts of a read, ms CPU (means):")
    print(table(["messages", "read"] + list(PARTS), parts))


if __name__ == "__main__":
    main()
