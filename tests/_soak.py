"""Helpers for the many-writers, crash and fault tests: soak size, worker processes, states that
carry their own checksum, and a full consistency check of a store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3

from cas_checkpoint import CheckpointStore

WORKER = Path(__file__).with_name("soak_worker.py")
FULL = os.environ.get("CAS_SOAK", "small").lower() == "full"


def soak(small: int, full: int) -> int:
    """A size: ``small`` by default (CI), ``full`` with CAS_SOAK=full."""
    return full if FULL else small


def digest(payload: Any) -> str:
    return blake3.blake3(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


def make_state(writer: int, i: int, pad: int = 0) -> dict[str, Any]:
    """A state that carries a checksum of itself, so a reader can tell a complete one."""
    payload = {"w": writer, "i": i, "pad": "x" * pad,
               "messages": [{"role": "user", "content": f"message {k} of {writer}/{i}"}
                            for k in range(i % 7 + 1)]}
    return {"payload": payload, "sum": digest(payload)}


def check_state(state: Any) -> str:
    assert isinstance(state, dict) and state["sum"] == digest(state["payload"]), (
        f"incomplete or mixed state: {str(state)[:200]}")
    return str(state["sum"])


@dataclass
class Result:
    """What one worker process reported on stdout."""

    acked: list[tuple[str, str, str]] = field(default_factory=list)  # thread, id, digest
    attempted: set[str] = field(default_factory=set)  # digests
    seen: set[str] = field(default_factory=set)  # digests a reader loaded
    loads: int = 0
    conflicts: int = 0
    errors: list[str] = field(default_factory=list)
    ready: bool = False
    done: bool = False
    returncode: int | None = None
    stderr: str = ""

    def feed(self, line: str) -> None:
        parts = line.split(" ", 3)
        if parts[0] == "ok" and len(parts) == 4:
            self.acked.append((parts[1], parts[2], parts[3]))
        elif parts[0] == "attempt":
            self.attempted.add(parts[2])
        elif parts[0] == "saw":
            self.seen.add(parts[1])
        elif parts[0] == "conflict":
            self.conflicts += 1
        elif parts[0] == "error":
            self.errors.append(line)
        elif parts[0] == "ready":
            self.ready = True
        elif parts[0] == "done":
            self.done = True
            if len(parts) > 1:
                self.loads = int(parts[1])


def spawn(cfg: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(WORKER), json.dumps(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 900) -> Result:
    """Wait for a worker (``timeout`` only guards against a hang) and parse what it said."""
    out, err = proc.communicate(timeout=timeout)
    res = Result(returncode=proc.returncode, stderr=err)
    for line in out.split("\n")[:-1]:  # a line cut short by a kill has no newline
        res.feed(line)
    return res


def run_all(cfgs: list[dict[str, Any]]) -> list[Result]:
    procs = [spawn(c) for c in cfgs]
    results = [finish(p) for p in procs]
    for r in results:
        assert r.done and r.returncode == 0, f"worker failed ({r.returncode}): {r.stderr[-2000:]}"
    return results


def load_history(store: CheckpointStore, thread: str) -> dict[str, Any]:
    """Every checkpoint of the thread's history, by id: their states, decoded from one read of
    its ref and packs (``store.load`` by id finds its entry by walking the log: a load of each
    after every kill of a soak was quadratic)."""
    ids = [h.id for h in store.history(thread)]
    got = store._run(store._core.load_many(thread, ids))
    assert list(got) == ids
    return {cid: cp.state for cid, cp in got.items()}


def check_store(store: CheckpointStore, acked: Iterable[tuple[str, str]],
                states: bool = True) -> int:
    """Every ref decodes; each thread's log is linear (each entry's parent is the one before),
    has no checkpoint twice and no save twice; every acknowledged (thread, id) is in its thread;
    every listed checkpoint loads (state checksum checked). Returns the checkpoints found."""
    present: set[tuple[str, str]] = set()
    for thread in store.threads():
        ref = store.refs.read(thread)
        assert ref is not None and ref.head.head is not None
        hist = store.history(thread)
        ids = [h.id for h in hist]
        assert len(ids) == len(set(ids)) == store.count(thread), f"{thread}: duplicate ids"
        assert ids[0] == store.head(thread)
        for newer, older in zip(hist, hist[1:], strict=False):
            assert newer.parent_ids == (older.id,), f"{thread}: log is not linear"
        assert hist[-1].parent_ids == ()
        keys = [(h.metadata["w"], h.metadata["i"]) for h in hist if "w" in h.metadata]
        assert len(keys) == len(set(keys)), f"{thread}: a save was appended twice"
        for h in hist:
            present.add((thread, h.id))
            if states:
                check_state(store.load(thread, h.id).state)
    missing = set(acked) - present
    assert not missing, f"{len(missing)} acknowledged saves are missing: {sorted(missing)[:3]}"
    return len(present)
