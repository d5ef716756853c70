"""The viewer's first paint (``cas-checkpoint ui``), beside the store calls each page makes and
beside the command line printing the same thing, in one run, on local disk.

  history     /thread of a thread of N checkpoints (its newest 200 drawn) vs
              ``store.history(limit=201)`` + ``count`` alone vs ``cas-checkpoint log --graph -n
              200`` in-process
  checkpoint  /checkpoint of a state of M messages (~380 bytes each) vs its ``read_part`` calls
              (the root, the last 50 messages) vs ``cas-checkpoint show``; and ``store.load``
  last msg    opening the last message of that state (/node) after the page vs
              ``read_part(["messages", -1])`` on a fresh store vs ``show --path messages[-1]``
  threads     / of a store of T threads vs ``threads()`` + each row's ``history(limit=1)``
              and ``count``
Each measured on a fresh store object and app (nothing cached), the median of --repeat runs.

    python benchmarks/bench_ui.py [--checkpoints 10000] [--messages 10000] [--threads 1000]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import median, message, table, version  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from cas_checkpoint import CheckpointStore  # noqa: E402
from cas_checkpoint.cli import main as cli  # noqa: E402
from cas_checkpoint.ui import create_app  # noqa: E402


def timed(fn: Callable[[], Any], repeat: int,
          setup: Callable[[], Any] = lambda: None) -> float:
    """Median ms of ``fn(setup())`` (setup untimed), or of ``fn()`` without a setup."""
    out = []
    for _ in range(repeat):
        arg = setup()
        t0 = time.perf_counter()
        fn(arg) if arg is not None else fn()
        out.append((time.perf_counter() - t0) * 1000)
    return median(out)


def page(url: str, path: str, before: str | None = None) -> float:
    """Median ms of one GET of ``path`` from an app over a freshly opened store (opened, and
    ``before`` got, untimed: the server has started, the user is on that page)."""
    def setup() -> TestClient:
        c = TestClient(create_app(CheckpointStore.open(url)))
        if before:
            c.get(before)
        return c

    def get(c: TestClient) -> None:
        r = c.get(path)
        assert r.status_code == 200, r.text[:500]
    return timed(get, REPEAT[0], setup)


REPEAT = [5]


def quiet_cli(*args: str) -> Callable[[], Any]:
    def run() -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            assert cli(list(args)) == 0
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoints", type=int, default=10_000)
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--threads", type=int, default=1_000)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    REPEAT[0] = a.repeat
    rng = random.Random(7)
    root = tempfile.mkdtemp(prefix="bench-ui-")
    url = str(Path(root) / "s")
    store = CheckpointStore.open(url, create=True)
    t0 = time.perf_counter()
    for i in range(a.checkpoints):
        store.save("long", {"step": i, "note": f"turn {i}"})
    big = store.save("chat", {"messages": [message(i, rng) for i in range(a.messages)]})
    for t in range(a.threads):
        store.save(f"t{t:05}", {"x": t})
    print(f"built {url} in {time.perf_counter() - t0:.0f} s; cas_checkpoint "
          f"{version('cas_checkpoint')}, starlette {version('starlette')}, "
          f"jinja2 {version('jinja2')}; median of {a.repeat}")

    def fresh() -> CheckpointStore:
        return CheckpointStore.open(url)

    def store_history(s: CheckpointStore) -> None:
        s.history("long", limit=201)
        s.count("long")

    def store_part(s: CheckpointStore) -> None:  # what the page asks: root, last 50
        s.read_part("chat")
        s.read_part("chat", None, ["messages"], start=a.messages - 50, count=50)

    def store_load(s: CheckpointStore) -> None:
        s.load("chat")

    def last_message(s: CheckpointStore) -> None:
        s.read_part("chat", None, ["messages", -1])

    def store_rows(s: CheckpointStore) -> None:
        for t in s.threads()[:50]:
            s.history(t, limit=1)
            s.count(t)

    msg_path = f"/node?thread=chat&id={big.id}&path=%5B%22messages%22,{a.messages - 1}%5D"
    cp_path = f"/checkpoint?thread=chat&id={big.id}"
    rows = [
        [f"history ({a.checkpoints:,} checkpoints)", page(url, "/thread?id=long"),
         timed(store_history, a.repeat, fresh),
         timed(quiet_cli("log", url, "long", "--graph", "-n", "200"), a.repeat)],
        [f"checkpoint ({a.messages:,} messages)", page(url, cp_path),
         timed(store_part, a.repeat, fresh), timed(quiet_cli("show", url, "chat"), a.repeat)],
        ["  (the whole state: store.load)", 0.0, timed(store_load, a.repeat, fresh), 0.0],
        ["last message, on that page", page(url, msg_path, before=cp_path),
         timed(last_message, a.repeat, fresh),
         timed(quiet_cli("show", url, "chat", "--path", "messages[-1]"), a.repeat)],
        [f"threads ({a.threads + 2:,}), first 50", page(url, "/"),
         timed(store_rows, a.repeat, fresh), timed(quiet_cli("threads", url), a.repeat)],
    ]
    print(table(["page (first paint)", "ui ms", "its store calls ms", "CLI ms (with open)"],
                [[r[0], f"{r[1]:.0f}", f"{r[2]:.0f}", f"{r[3]:.0f}"] for r in rows]))


if __name__ == "__main__":
    main()
