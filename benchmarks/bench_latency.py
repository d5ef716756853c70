"""Save and load latency of a 100-message state, local disk and S3 (moto server), beside a naive
baseline that writes one JSON file per checkpoint (plus a JSON "latest" pointer), in one run.

    python benchmarks/bench_latency.py [--n 100] [--s3-n 50]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import median, message, moto_s3, pct, table  # noqa: E402

from cas_checkpoint import CheckpointStore  # noqa: E402


class JsonBaseline:
    """One JSON file per checkpoint and a pointer file to the latest, on an fsspec filesystem."""

    def __init__(self, fs: Any, root: str) -> None:
        self.fs, self.root = fs, root.rstrip("/")

    def save(self, thread: str, state: dict[str, Any]) -> str:
        cid = uuid.uuid4().hex
        self.fs.pipe_file(f"{self.root}/{thread}/{cid}.json", json.dumps(state).encode())
        self.fs.pipe_file(f"{self.root}/{thread}/latest", cid.encode())
        return cid

    def load(self, thread: str) -> dict[str, Any]:
        cid = self.fs.cat_file(f"{self.root}/{thread}/latest").decode()
        return json.loads(self.fs.cat_file(f"{self.root}/{thread}/{cid}.json"))  # type: ignore


def measure(store: Any, n: int) -> tuple[list[float], list[float]]:
    rng = random.Random(1)
    state: dict[str, Any] = {"messages": [message(i, rng) for i in range(100)], "step": 0}
    saves, loads = [], []
    for i in range(n):
        state["step"] = i
        state["messages"][-1] = message(1000 + i, rng)  # a new last message each step
        t0 = time.perf_counter()
        store.save("bench", state)
        saves.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        got = store.load("bench")
        loads.append(time.perf_counter() - t0)
        got = got.state if hasattr(got, "state") else got
        assert got["step"] == i
    return saves, loads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=100, help="saves per local run")
    ap.add_argument("--s3-n", type=int, default=50, help="saves per S3 run")
    args = ap.parse_args()
    import fsspec

    rows = []

    def row(where: str, what: str, saves: list[float], loads: list[float]) -> None:
        ms = [f"{1000 * f(v, q):.2f}" for v in (saves, loads)
              for f, q in ((lambda x, _q: median(x), 0), (pct, 0.95))]
        rows.append([where, what, *ms])

    with tempfile.TemporaryDirectory() as tmp:
        local = fsspec.filesystem("file", auto_mkdir=True)
        row("local", "cas_checkpoint", *measure(CheckpointStore.open(f"{tmp}/cas"), args.n))
        row("local", "JSON file per checkpoint", *measure(JsonBaseline(local, f"{tmp}/json"),
                                                          args.n))
    with moto_s3() as opts:
        s3 = fsspec.filesystem("s3", **opts)
        row("s3 (moto)", "cas_checkpoint",
            *measure(CheckpointStore.open("s3://bench/cas", storage_options=opts), args.s3_n))
        row("s3 (moto)", "JSON file per checkpoint", *measure(JsonBaseline(s3, "bench/json"),
                                                              args.s3_n))
    print("save/load latency, 100-message state (~40 KB), ms")
    print(table(["storage", "store", "save p50", "save p95", "load p50", "load p95"], rows))


if __name__ == "__main__":
    main()
