"""Search and diff by node id, beside doing the same on loaded states, in one run.

  search  1,000 threads forked from one 200-message conversation (~400-byte messages), each
          fork adding a message; a phrase searched over every thread's head with
          ``store.search`` (each distinct node read once) vs loading every head and scanning it.
  diff    two neighbours of a 10,000-message state (one message appended; one changed in the
          middle), of a 50,000-item list and of a 1 MB str (edited in the middle) with
          ``store.diff`` (shared subtrees skipped) vs loading both states and diffing them in
          Python; each in the current layout (concatenations give their children's lengths)
          and in the layout of stores written before lengths ("old": shared list parts are
          counted by reading them; a second ``store.diff`` on the same store object reuses
          those counts; a long str is read whole).
Memory and local stores; each measured on a fresh store object (nothing cached).

    python benchmarks/bench_search.py [--forks 1000] [--messages 200] [--big 10000]
    CAS_SOAK=full python benchmarks/bench_search.py      # 5,000 forks, 50,000 messages
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import human, message, table  # noqa: E402

from cas_checkpoint import CheckpointStore
from cas_checkpoint.engine.object_store import View  # noqa: E402
from cas_checkpoint.tree import build as tree  # noqa: E402


class NodeCount:
    """Counts the objects (and bytes) that loads take from views (a load takes each node of
    its state once; each load counts its own)."""

    def __init__(self) -> None:
        self.nodes = 0
        self.bytes = 0
        self._real = View.get

    def __enter__(self) -> NodeCount:
        real = self._real

        def get(view: View, oid: str) -> bytes:
            data = real(view, oid)
            self.nodes += 1
            self.bytes += len(data)
            return data

        View.get = get  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        View.get = self._real  # type: ignore[method-assign]


def scan(value: Any, needle: str) -> int:
    """Plain search of a loaded state: str values containing ``needle`` (casefolded)."""
    found, stack = 0, [value]
    while stack:
        item = stack.pop()
        if type(item) is str:
            found += needle in item.casefold()
        elif type(item) in (list, tuple):
            stack.extend(item)
        elif type(item) is dict:
            stack.extend(item.values())
    return found


def plain_diff(a: Any, b: Any) -> int:
    """Changes between two loaded states, by index and key (as ``store.diff`` reports them)."""
    changes, stack = 0, [(a, b)]
    while stack:
        x, y = stack.pop()
        if type(x) is not type(y):
            changes += 1
        elif type(x) is dict:
            changes += len(x.keys() ^ y.keys())
            stack.extend((x[k], y[k]) for k in x.keys() & y.keys())
        elif type(x) in (list, tuple):
            changes += abs(len(x) - len(y))
            stack.extend(zip(x, y, strict=False))
        elif x != y:
            changes += 1
    return changes


def open_store(kind: str, tmp: str) -> CheckpointStore:
    if kind == "memory":
        return CheckpointStore.open(f"memory://bench-search-{uuid.uuid4().hex[:8]}")
    return CheckpointStore.open(os.path.join(tmp, f"store-{uuid.uuid4().hex[:8]}"))


def bench_search(kind: str, tmp: str, forks: int, n_messages: int) -> list[list[Any]]:
    rng = random.Random(1)
    msgs = [message(i, rng, 400) for i in range(n_messages)]
    msgs[n_messages // 2]["content"] += " the launch code is pelican"
    store = open_store(kind, tmp)
    base = store.save("base", {"messages": msgs, "step": n_messages})
    for i in range(forks):
        thread = f"fork-{i:05d}"
        store.fork("base", base.id, thread)
        store.save(thread, {"messages": msgs + [message(n_messages + i, rng, 400)],
                            "step": n_messages + 1})
    fresh = CheckpointStore.open(store.url)
    t0 = time.perf_counter()
    got = fresh.search("Launch Code")
    ours = time.perf_counter() - t0
    assert len(got.matches) == forks + 1, len(got.matches)
    naive = CheckpointStore.open(store.url)
    with NodeCount() as count:
        t0 = time.perf_counter()
        hits = sum(scan(naive.load(t).state, "launch code") for t in naive.threads())
        plain = time.perf_counter() - t0
    assert hits == forks + 1
    what = f"search {forks + 1:,} heads"
    return [[kind, what, "store.search", f"{got.nodes_read:,}", human(got.bytes_read),
             f"{ours:.2f}"],
            [kind, what, "load + scan", f"{count.nodes:,}", human(count.bytes),
             f"{plain:.2f}"]]


def bench_diff(kind: str, tmp: str, n: int, layout: str) -> list[list[Any]]:
    """Neighbours of big states, saved with lengths in concatenations ("lengths") or in the
    layout of stores written before them ("old"): diffed on fresh store objects."""
    rng = random.Random(2)
    msgs = [message(i, rng, 400) for i in range(n)]
    store = open_store(kind, tmp)
    tree.WRITE_LENGTHS = layout == "lengths"
    try:
        a = store.save("t", {"messages": msgs, "step": 1})
        extra = message(n, rng, 400)
        b = store.save("t", {"messages": msgs + [extra], "step": 2})
        edited = msgs + [extra]
        edited[n // 2] = dict(edited[n // 2], content="edited")
        c = store.save("t", {"messages": edited, "step": 2})
        items = [f"item {i} " + "y" * (i % 50) for i in range(5 * n)]
        d1 = store.save("u", {"items": items})
        items[len(items) // 2] = "changed"
        d2 = store.save("u", {"items": items})
        text = "".join(rng.choice("abcdefgh \n") for _ in range(100 * n))
        e1 = store.save("v", {"doc": text})
        e2 = store.save("v", {"doc": text[:len(text) // 2] + "EDIT" + text[len(text) // 2 + 4:]})
    finally:
        tree.WRITE_LENGTHS = True
    rows = []
    for what, x, y in ((f"diff {n:,} msgs: append", a, b),
                       (f"diff {n:,} msgs: edit middle", b, c),
                       (f"diff {5 * n:,} items: edit middle", d1, d2),
                       (f"diff {100 * n / 1e6:g} MB str: edit middle", e1, e2)):
        fresh = CheckpointStore.open(store.url)
        t0 = time.perf_counter()
        d = fresh.diff(x.id, y.id)
        ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = fresh.diff(x.id, y.id)
        warm = time.perf_counter() - t0
        naive = CheckpointStore.open(store.url)
        with NodeCount() as count:
            t0 = time.perf_counter()
            changes = plain_diff(naive.get(x.id).state, naive.get(y.id).state)
            plain = time.perf_counter() - t0
        assert changes == len(d.changes) == len(again.changes), (changes, d.changes)
        counted = f" ({d.nodes_counted} to count)" if d.nodes_counted else ""
        rows += [[kind, layout, what, "store.diff", f"{d.nodes_read:,}{counted}",
                  human(d.bytes_read), f"{ours:.3f}"],
                 [kind, layout, what, "store.diff again", f"{again.nodes_read:,}",
                  human(again.bytes_read), f"{warm:.3f}"]]
        if layout == "lengths":
            rows.append([kind, "", what, "get both + diff", f"{count.nodes:,}",
                         human(count.bytes), f"{plain:.3f}"])
    return rows


def main() -> None:
    full = os.environ.get("CAS_SOAK") == "full"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forks", type=int, default=5000 if full else 1000)
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--big", type=int, default=50_000 if full else 10_000)
    parser.add_argument("--kinds", default="memory,local")
    args = parser.parse_args()
    rows: list[list[Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds.split(","):
            rows += [[r[0], "", *r[1:]] for r in bench_search(kind, tmp, args.forks,
                                                               args.messages)]
            for layout in ("lengths", "old"):
                rows += bench_diff(kind, tmp, args.big, layout)
    print(table(["store", "nodes", "workload", "how", "nodes read", "bytes read", "seconds"],
                rows))


if __name__ == "__main__":
    main()
