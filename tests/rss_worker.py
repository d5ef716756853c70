"""Run by test_memory_bound.py in a subprocess: save to (or load) N different threads through
one store object and print its RSS (MB) every N/10 threads, as JSON."""

from __future__ import annotations

import json
import os
import sys
import tempfile

from cas_checkpoint import CheckpointStore


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def state(i: int) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": f"message {k} of {i} " * 8}
                         for k in range(6)], "i": i}


def main() -> None:
    mode, n, cache = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    root = tempfile.mkdtemp(prefix="rss-")
    if mode == "load":
        writer = CheckpointStore.open(root)
        for i in range(n):
            writer.save(f"thread-{i}", state(i))
        del writer
    store = CheckpointStore.open(root, cache_bytes=cache)
    samples = []
    for i in range(n):
        if mode == "save":
            store.save(f"thread-{i}", state(i))
        else:
            assert store.load(f"thread-{i}").state["i"] == i
        if (i + 1) % (n // 10) == 0:
            samples.append(round(rss_mb(), 1))
    print(json.dumps(samples))


if __name__ == "__main__":
    main()
