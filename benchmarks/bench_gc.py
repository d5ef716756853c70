"""gc time and request counts for stores of many packs, with about 0%, 50% and 90% garbage.

    python benchmarks/bench_gc.py                 # local 2,000 and 20,000 saves, S3 (moto) 2,000
    python benchmarks/bench_gc.py --local 5000 --s3 0 --garbage 0,90

Stores are built through the public API: saves spread over 10 threads, each save flushing its
objects into a pack (``inline_max=1``), so merges leave packs no ref names. Garbage is then made
by deleting threads (their packs become unnamed). gc reads the refs and lists ``packs/``; it
reads no object, so its cost grows with threads and packs, never with the nodes inside them.
Every pack is older than the grace (gc runs with grace 0; on S3 after a 2-second pause, with
force=True).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import time
from datetime import timedelta
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import message, moto_s3, table  # noqa: E402

from cas_checkpoint import CheckpointStore  # noqa: E402

THREADS = 10


def build(store: CheckpointStore, saves: int) -> None:
    store.refs.inline_max = 1
    rng = random.Random(7)
    msgs: dict[str, list[dict[str, Any]]] = {f"t{t}": [] for t in range(THREADS)}
    for i in range(saves):
        thread = f"t{i % THREADS}"
        msgs[thread].append(message(i, rng, 300))
        store.save(thread, {"messages": msgs[thread]})


def run(store: CheckpointStore, kind: str, saves: int, garbages: list[int],
        rows: list[list[Any]]) -> None:
    t0 = time.perf_counter()
    build(store, saves)
    built = time.perf_counter() - t0
    first = True
    for pct in garbages:
        for t in range(round(THREADS * pct / 100)):
            if f"t{t}" in store.threads():
                store.delete_thread(f"t{t}")
        if kind == "s3":
            time.sleep(2.2)  # LastModified has a 1-second resolution
        packs = len(store.backend.list("packs"))
        r = store.gc(grace=timedelta(0), force=True)
        rows.append([kind, f"{saves:,}" if first else "", f"{packs:,}", f"{pct}%",
                     f"{r.reachable_objects:,}", f"{r.deleted_objects:,}", f"{r.seconds:.2f}",
                     f"{r.requests['list']:,}", f"{r.requests['get']:,}",
                     f"{r.requests['delete']:,}", f"{built:.0f}" if first else ""])
        first = False
        print(" | ".join(rows[-1]), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--local", default="2000,20000", help="local store sizes (saves)")
    ap.add_argument("--s3", default="2000", help="S3 (moto) store sizes (saves); 0 to skip")
    ap.add_argument("--garbage", default="0,50,90", help="threads deleted, in percent")
    ap.add_argument("--dir", default="/tmp/cas-bench-gc", help="where local stores go")
    args = ap.parse_args()
    garbages = [int(g) for g in args.garbage.split(",")]
    rows: list[list[Any]] = []
    for n in [int(x) for x in args.local.split(",") if int(x)]:
        path = os.path.join(args.dir, f"local-{n}-{os.getpid()}")
        run(CheckpointStore.open(path), "local", n, garbages, rows)
        shutil.rmtree(path, ignore_errors=True)
    sizes = [int(x) for x in args.s3.split(",") if int(x)]
    if sizes:
        with moto_s3() as options:
            for n in sizes:
                store = CheckpointStore.open(f"s3://bench/gc-{n}-{os.getpid()}",
                                             storage_options=options)
                run(store, "s3", n, garbages, rows)
    print()
    print(table(["storage", "saves", "packs", "threads deleted", "reachable packs", "deleted",
                 "gc s", "list req", "get req", "delete req", "build s"], rows))
    print("\nrequests: S3 HTTP requests (list pages, GETs of refs, DeleteObjects batches); on "
          "local disk the matching calls")


if __name__ == "__main__":
    main()
