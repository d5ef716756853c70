"""Deep verify of a local store beside the baseline of BLAKE3-hashing the same object files read
sequentially in one process, measured in one run (the target: verify at >= 0.5x the baseline).

    python benchmarks/bench_verify.py [--mb 64] [--item-kb 16] [--runs 3] [--dir PATH]

The store holds ``--mb`` MB of distinct state (lists of ``--item-kb`` KB random byte strings, one
1 MB state per checkpoint, 8 checkpoints a thread). Both sides read the page cache after a warm-up
read; the sides run interleaved and each figure is the best of ``--runs``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import blake3

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import human, table  # noqa: E402

from cas_checkpoint import CheckpointStore  # noqa: E402


def build(path: str, mb: int, item_kb: int) -> CheckpointStore:
    store = CheckpointStore.open(path)
    per_state = max(1, 1024 // item_kb)
    for i in range(mb):
        state = {"messages": [os.urandom(item_kb * 1024) for _ in range(per_state)], "i": i}
        store.save(f"thread-{i // 8}", state)
    return store


def sequential_hash(root: str) -> tuple[int, int]:
    """Read every pack file one after another and check its BLAKE3 name: (files, bytes)."""
    files = total = 0
    base = os.path.join(root, "packs")
    for folder in sorted(os.listdir(base)):
        for name in sorted(os.listdir(os.path.join(base, folder))):
            with open(os.path.join(base, folder, name), "rb") as f:
                data = f.read()
            if blake3.blake3(data).hexdigest() != folder + name:
                raise SystemExit(f"pack {folder}/{name} is damaged")
            files += 1
            total += len(data)
    return files, total


def best(fn: object, runs: int) -> tuple[float, object]:
    out, times = None, []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=64, help="MB of state to store (default 64)")
    parser.add_argument("--item-kb", type=int, default=16, help="KB per list item (default 16)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to build the store (default: a temp "
                        "dir, removed afterwards)")
    args = parser.parse_args()
    tmp = args.dir or tempfile.mkdtemp(prefix="bench-verify-")
    try:
        path = os.path.join(tmp, "store")
        t0 = time.perf_counter()
        store = build(path, args.mb, args.item_kb)
        print(f"built {path}: {args.mb} MB of state in {time.perf_counter() - t0:.1f} s, "
              f"{os.cpu_count()} CPUs")
        sequential_hash(path)  # warm the page cache for both sides
        seqs, deeps, quicks = [], [], []
        for _ in range(args.runs):  # interleaved, so both sides see the same machine load
            seqs.append(best(lambda: sequential_hash(path), 1))
            deeps.append(best(lambda: store.verify(deep=True), 1))
            quicks.append(best(lambda: store.verify(deep=False), 1))
        t_seq, (files, nbytes) = min(seqs, key=lambda r: r[0])  # type: ignore[misc]
        t_deep, deep = min(deeps, key=lambda r: r[0])
        t_quick, quick = min(quicks, key=lambda r: r[0])
        assert deep.ok and quick.ok, deep.to_text()  # type: ignore[attr-defined]
        hashed = deep.bytes_hashed  # type: ignore[attr-defined]
        seq_rate = nbytes / t_seq / 2**20
        rows = [
            ["sequential read + blake3 (baseline)", files, human(nbytes), f"{t_seq:.2f}",
             f"{seq_rate:.0f}", "1.00"],
            ["store.verify(deep=True)", deep.objects, human(hashed),  # type: ignore[attr-defined]
             f"{t_deep:.2f}", f"{hashed / t_deep / 2**20:.0f}",
             f"{hashed / t_deep / 2**20 / seq_rate:.2f}"],
            ["store.verify(deep=False)", quick.objects,  # type: ignore[attr-defined]
             human(quick.bytes_hashed), f"{t_quick:.2f}", "-",  # type: ignore[attr-defined]
             f"{t_seq / t_quick:.2f} (by time)"],
        ]
        print(table(["what", "objects", "bytes hashed", "seconds", "MB/s", "ratio"], rows))
    finally:
        if args.dir is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
