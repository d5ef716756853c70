"""gc time and request counts for stores of many objects, with 0%, 50% and 90% garbage.

    python benchmarks/bench_gc.py                     # local 10k and 100k, S3 (moto) 10k
    python benchmarks/bench_gc.py --local 10000 --s3 0 --garbage 0,90

Stores are built directly through the object store (local: files written without fsync, which
is much faster than full saves): each checkpoint is a record, a root state node and 3 leaf nodes
(5 objects), and threads' logs (built with refs.build, so log segments are real) name the
reachable ones. The garbage is the checkpoints no log names: a real reachable/garbage split, which
gc has to discover by reading every reachable object. Every object is older than the grace
(gc runs with grace 0; on S3 after a 1-second pause, with force=True).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import moto_s3, table  # noqa: E402

from cas_checkpoint import CheckpointStore, codec  # noqa: E402
from cas_checkpoint.backend import LocalBackend  # noqa: E402
from cas_checkpoint.objects import (  # noqa: E402
    CheckpointId,
    LogEntry,
    ObjectId,
    Record,
    encode_node,
    object_id,
)
from cas_checkpoint.objstore import object_key  # noqa: E402
from cas_checkpoint.refs import build, thread_key  # noqa: E402

PER_CHECKPOINT = 5
THREADS = 8


def make_checkpoints(n_objects: int) -> list[tuple[LogEntry, dict[ObjectId, bytes]]]:
    out = []
    now = time.time()
    for i in range(max(1, n_objects // PER_CHECKPOINT)):
        leaves = [encode_node(codec.encode(["leaf", i, j, "x" * 40])) for j in range(3)]
        ids = tuple(object_id(d) for d in leaves)
        root = encode_node(codec.encode(["root", i]), ids)
        rid = object_id(root)
        rec = Record(f"t{i % THREADS}", (), rid, i, now, 200).encode()
        cid = CheckpointId(object_id(rec))
        objs = {ObjectId(cid): rec, rid: root, **dict(zip(ids, leaves, strict=True))}
        out.append((Record.decode(rec).entry(cid), objs))
    return out


def put_objects(store: CheckpointStore, objs: dict[ObjectId, bytes]) -> None:
    if isinstance(store.backend, LocalBackend):
        made: set[str] = set()
        for oid, data in objs.items():
            path = os.path.join(store.backend.root, *object_key(oid).split("/"))
            folder = os.path.dirname(path)
            if folder not in made:
                os.makedirs(folder, exist_ok=True)
                made.add(folder)
            with open(path, "wb") as f:
                f.write(data)
    else:
        items = list(objs.items())
        for i in range(0, len(items), 2000):
            store.objects.put_many(dict(items[i:i + 2000]))


def set_refs(store: CheckpointStore, cps: list[tuple[LogEntry, Any]], reachable: int) -> None:
    for t in range(THREADS):
        thread = f"t{t}"
        entries = [e for i, (e, _) in enumerate(cps[:reachable]) if i % THREADS == t]
        key = thread_key(thread)
        cur = store.backend.read_ref(key)
        if not entries:
            if cur is not None:
                store.backend.delete_ref(key, cur[1])
            continue
        new: dict[ObjectId, bytes] = {}
        head = build(thread, entries, entries[-1].id, new)
        put_objects(store, new)
        store.backend.write_ref(key, head.encode(), cur[1] if cur else None)


def run(store: CheckpointStore, kind: str, n_objects: int, garbages: list[int],
        rows: list[list[Any]]) -> None:
    t = time.perf_counter()
    cps = make_checkpoints(n_objects)
    present: set[str] = set()
    for pct in garbages:
        missing = {k: v for _, objs in cps for k, v in objs.items() if k not in present}
        put_objects(store, missing)
        present.update(missing)
        set_refs(store, cps, round(len(cps) * (100 - pct) / 100))
        built = time.perf_counter() - t
        if kind == "s3":
            time.sleep(1.1)
        r = store.gc(grace=timedelta(0), force=True)
        present.difference_update(r.deleted)
        rows.append([kind, f"{r.scanned_objects:,}", f"{pct}%", f"{r.reachable_objects:,}",
                     f"{r.deleted_objects:,}", f"{r.seconds:.2f}",
                     f"{r.requests['list']:,}", f"{r.requests['get']:,}",
                     f"{r.requests['delete']:,}", f"{built:.0f}"])
        print(" | ".join(rows[-1]), flush=True)
        t = time.perf_counter()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--local", default="10000,100000", help="local store sizes (objects)")
    ap.add_argument("--s3", default="10000", help="S3 (moto) store sizes; 0 to skip")
    ap.add_argument("--garbage", default="0,50,90", help="garbage percentages")
    ap.add_argument("--dir", default="/tmp/cas-bench-gc", help="where local stores go")
    args = ap.parse_args()
    garbages = [int(g) for g in args.garbage.split(",")]
    rows: list[list[Any]] = []
    for n in [int(x) for x in args.local.split(",") if int(x)]:
        path = os.path.join(args.dir, f"local-{n}-{os.getpid()}")
        run(CheckpointStore.open(path), "local", n, garbages, rows)
        import shutil

        shutil.rmtree(path, ignore_errors=True)
    sizes = [int(x) for x in args.s3.split(",") if int(x)]
    if sizes:
        with moto_s3() as options:
            for n in sizes:
                store = CheckpointStore.open(f"s3://bench/gc-{n}-{os.getpid()}",
                                             storage_options=options)
                run(store, "s3", n, garbages, rows)
    print()
    print(table(["storage", "objects", "garbage", "reachable", "deleted", "gc s", "list req",
                 "get req", "delete req", "build s"], rows))
    print("\nrequests: S3 HTTP requests (list pages, GETs, DeleteObjects batches); on local "
          "disk the matching calls (a 'delete' there is one rename+stat+unlink per object)")


if __name__ == "__main__":
    main()
