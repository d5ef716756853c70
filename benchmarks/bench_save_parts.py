"""What a memory:// save spends on the three steps no content-addressed save can skip, against
issue 29's budget (3x InMemorySaver's CPU a call).

The tool loop's ``put`` and ``put_writes`` calls (``bench_langgraph.py``'s, recorded once with
the arguments LangGraph handed them) are replayed into a fresh CasSaver on memory:// and a fresh
InMemorySaver, taking turns, ``--rounds`` times, after an untimed full collection each. In
CasSaver's rounds three steps are timed around (CPU of the calling thread), each averaged over
all the calls, as the budget is:

* the put encoder (``PutEncoder.state``): the checkpoint's encoding from what changed;
* the tree split (``tree.build``): the state cut into nodes and the new ones hashed;
* the head's encoding (``Head.encode``): the thread's new head, checksummed.

What is left of a call beyond them is the commit around them (parent lookup, record and log
entry, staging, the compare-and-swap, caches, the saver's glue).

    python benchmarks/bench_save_parts.py [--steps 20,200] [--rounds 7]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import table  # noqa: E402

PARTS = ("put encoder", "tree split", "head encoding")


def _timed(owner: Any, attr: str, acc: dict[str, float], key: str) -> None:
    fn: Callable[..., Any] = getattr(owner, attr)

    def call(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[key] += time.thread_time() - start

    setattr(owner, attr, call)


def measure(steps: int, rounds: int) -> list[list[str]]:
    from bench_langgraph import recorded_calls
    from langgraph.checkpoint.memory import InMemorySaver

    from cas_checkpoint.format.heads import Head
    from cas_checkpoint.integrations.langgraph import CasSaver
    from cas_checkpoint.integrations.langgraph.encode import PutEncoder
    from cas_checkpoint.tree import build as tree

    calls = recorded_calls(steps)
    acc = dict.fromkeys(PARTS, 0.0)
    _timed(PutEncoder, "state", acc, "put encoder")
    _timed(tree, "build", acc, "tree split")
    _timed(Head, "encode", acc, "head encoding")
    cpu: dict[str, list[float]] = {"InMemorySaver": [], "CasSaver memory://": []}
    parts: list[dict[str, float]] = []
    for _ in range(rounds):
        for name in cpu:
            saver: Any = (InMemorySaver() if name == "InMemorySaver" else
                          CasSaver.from_url(f"memory://save-parts-{uuid.uuid4().hex[:8]}"))
            gc.collect()
            acc.update(dict.fromkeys(PARTS, 0.0))
            start = time.thread_time()
            for kind, args in calls:
                getattr(saver, kind)(*args)
            cpu[name].append((time.thread_time() - start) / len(calls))
            if name != "InMemorySaver":
                parts.append({p: acc[p] / len(calls) for p in PARTS})
    base = statistics.median(cpu["InMemorySaver"])
    cas = statistics.median(cpu["CasSaver memory://"])
    us = {p: statistics.median(r[p] for r in parts) * 1e6 for p in PARTS}
    three = sum(us.values())
    rows = [[str(steps), "InMemorySaver, a call", f"{base * 1e6:.1f}", "1.00x"],
            [str(steps), "CasSaver memory://, a call", f"{cas * 1e6:.1f}", f"{cas / base:.2f}x"],
            [str(steps), "budget: 3x InMemorySaver", f"{3 * base * 1e6:.1f}", "3.00x"]]
    rows += [[str(steps), f"  {p}", f"{us[p]:.1f}", f"{us[p] / (base * 1e6):.2f}x"]
             for p in PARTS]
    rows.append([str(steps), "  the three together", f"{three:.1f}",
                 f"{three / (base * 1e6):.2f}x"])
    rows.append([str(steps), "  the rest of the call", f"{cas * 1e6 - three:.1f}",
                 f"{(cas * 1e6 - three) / (base * 1e6):.2f}x"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", default="20,200")
    ap.add_argument("--rounds", type=int, default=7)
    ns = ap.parse_args()
    try:
        steps = [int(s) for s in ns.steps.split(",")]
    except ValueError:
        ap.error(f"--steps takes comma-separated step counts, not {ns.steps!r}")
    if ns.rounds < 1:
        ap.error("--rounds must be at least 1")
    print(f"load average {os.getloadavg()[0]:.1f}; {ns.rounds} rounds taking turns; CPU "
          "medians, us a call (each part averaged over all the loop's calls)")
    rows: list[list[str]] = []
    for n in steps:
        rows += measure(n, ns.rounds)
    print(table(["steps", "", "us CPU a call", "x InMemorySaver"], rows))


if __name__ == "__main__":
    main()
