"""A long thread on its own (issue 29): does a save, a cold load and ``history(limit=10)`` cost
the same at 100 and at 100,000 checkpoints, and does the thread's garbage stay bounded?

Workload: a rolling window, the last 20 messages of 128-300 bytes and a step counter, saved
once a step on local disk, with the head's inline room set to nothing so every save flushes a
pack (the case where packs, merges and their garbage grow fastest). At each rung (1,000,
2,000, 4,000, ... checkpoints) it prints: bytes written a save (packs and ref, mean over the
saves since the last rung), save time (mean over the same saves), a cold load of the head and
``history(limit=10)`` (each in a new store object: nothing cached; median of 3), the packs the
head names, the packs its archive lists (``archive.py``), the bytes of both, and the bytes on
disk before any gc (over those: garbage, packs merges replaced). A last line gives each measure
at the top rung over its value at 1,000 (issue 29's target: within 1.5x at 100,000).

    python benchmarks/bench_long_thread.py [--max 8000] [--code PATH [--code-max N]] ...

The full curve (``--max 100000``) takes a few minutes with this version; a version whose saves
grow with the thread is given its own, smaller ``--code-max``.

``--code PATH`` runs the same curve with the cas_checkpoint of another checkout (for instance a
git worktree of main: ``git worktree add /tmp/main-old main``), one after the other in the same
run, each in a process of its own, and prints them one after the other.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import human, table  # noqa: E402


def _message(i: int, rng: random.Random) -> dict[str, Any]:
    size = rng.randint(128, 300)
    words = " ".join(rng.choice(("agent", "tool", "plan", "step", "query", "answer", "the"))
                     for _ in range(size // 5))
    return {"role": ("user", "assistant", "tool")[i % 3], "content": words[:size - 40],
            "id": f"m{i:07d}"}


def _disk_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def curve(top: int) -> list[dict[str, Any]]:
    """Grow one thread to ``top`` checkpoints; a row of measures at each rung."""
    from cas_checkpoint import CheckpointStore

    rungs = [r for r in (1000, 2000, 4000, 8000, 16000, 32000, 64000, 100000) if r <= top]
    rng = random.Random(29)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "s"
        store = CheckpointStore.open(str(root))
        store.refs.inline_max = 1  # every save flushes its new objects into a pack
        backend = store.backend
        written = [0]
        put_many, write_ref = backend.put_many, backend.write_ref

        def counted_put(items: dict[str, bytes]) -> None:
            written[0] += sum(map(len, items.values()))
            put_many(items)

        def counted_ref(key: str, data: bytes, expected: str | None, refresh: Any = None) -> str:
            written[0] += len(data)
            return write_ref(key, data, expected, refresh)

        backend.put_many = counted_put  # type: ignore[method-assign]
        backend.write_ref = counted_ref  # type: ignore[method-assign]
        window: list[dict[str, Any]] = []
        last, seconds = 0, 0.0
        for step in range(1, top + 1):
            window.append(_message(step, rng))
            del window[:-20]
            t0 = time.perf_counter()
            store.save("t", {"messages": window, "step": step})
            seconds += time.perf_counter() - t0
            if step not in rungs:
                continue
            loads, hist = [], []
            for _ in range(3):
                cold = CheckpointStore.open(str(root))
                t0 = time.perf_counter()
                assert cold.load("t").state["step"] == step
                loads.append(time.perf_counter() - t0)
                cold = CheckpointStore.open(str(root))
                t0 = time.perf_counter()
                assert len(cold.history("t", limit=10)) == 10
                hist.append(time.perf_counter() - t0)
            ref = store.refs.read("t")
            assert ref is not None
            archived = _archived(store, ref.head)
            named = sum(p.size for p in (*ref.head.packs, *archived))
            rows.append({"n": step, "bytes_a_save": written[0] / (step - last),
                         "save_ms": 1000 * seconds / (step - last),
                         "cold_load_ms": 1000 * statistics.median(loads),
                         "history10_ms": 1000 * statistics.median(hist),
                         "packs": len(ref.head.packs), "named_bytes": named,
                         "archived": len(archived),
                         "disk_bytes": _disk_bytes(root)})
            written[0], last, seconds = 0, step, 0.0
    return rows


def _archived(store: Any, head: Any) -> tuple[Any, ...]:
    """The head's archive's pack and the packs it lists (none, in a version without)."""
    if getattr(head, "archive", None) is None:
        return ()
    try:
        from cas_checkpoint.engine import archive
        from cas_checkpoint.engine import steps as ops
    except ImportError:  # (a checkout before the move into folders)
        from cas_checkpoint import archive, ops  # type: ignore[attr-defined,no-redef]

    return (head.archive, *ops.run(archive.archived(store._core.objects, head), store.backend))


def _print(label: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{label}")
    print(table(["checkpoints", "bytes/save", "save ms", "cold load ms", "history(10) ms",
                 "packs", "archived", "thread's packs", "on disk (no gc)", "disk / thread"],
                [[f"{r['n']:,}", human(r["bytes_a_save"]), f"{r['save_ms']:.2f}",
                  f"{r['cold_load_ms']:.1f}", f"{r['history10_ms']:.1f}", r["packs"],
                  r.get("archived", 0), human(r["named_bytes"]), human(r["disk_bytes"]),
                  f"{r['disk_bytes'] / max(1, r['named_bytes']):.1f}x"] for r in rows]))
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        print(f"at {last['n']:,} over {first['n']:,}: " + ", ".join(
            f"{name} {last[k] / max(first[k], 1e-9):.2f}x" for name, k in (
                ("bytes/save", "bytes_a_save"), ("save", "save_ms"),
                ("cold load", "cold_load_ms"), ("history(10)", "history10_ms"))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max", type=int, default=8000, help="checkpoints in the thread at the end")
    ap.add_argument("--code", action="append", default=[],
                    help="also run the curve with the cas_checkpoint of this checkout")
    ap.add_argument("--code-max", type=int, default=None,
                    help="checkpoints at the end for the --code checkouts (default: --max)")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # (a child's rows)
    args = ap.parse_args()
    if args.json:
        print(json.dumps(curve(args.max)))
        return
    here = str(Path(__file__).resolve().parents[1])
    for code in [here, *args.code]:
        env = dict(os.environ, PYTHONPATH=code)
        top = args.max if code == here or args.code_max is None else args.code_max
        out = subprocess.run([sys.executable, __file__, "--json", "--max", str(top)],
                             env=env, capture_output=True, text=True, check=True).stdout
        _print(f"cas_checkpoint from {code}", json.loads(out.strip().splitlines()[-1]))


if __name__ == "__main__":
    main()
