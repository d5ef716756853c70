"""Many writer processes on one store: nothing acknowledged is ever lost.

Real processes (subprocess), real disk, real HTTP to a moto server. Sizes come from CAS_SOAK
(small by default; CAS_SOAK=full runs 8 processes x 50 saves)."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from _soak import check_store, finish, make_state, run_all, soak, spawn

from cas_checkpoint import CheckpointStore

WRITERS = soak(3, 8)
SAVES = soak(8, 50)


def _target(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    if kind == "local":
        return {"url": str(tmp_path / "store")}
    server = request.getfixturevalue("moto_server")
    return {"url": f"s3://{server['bucket']}/{uuid.uuid4().hex[:12]}",
            "storage_options": server["storage_options"]}


def _open(target: dict[str, Any]) -> CheckpointStore:
    return CheckpointStore.open(target["url"], storage_options=target.get("storage_options"))


@pytest.mark.parametrize("kind", ["local", "s3"])
@pytest.mark.parametrize("layout", ["same-thread", "own-thread", "expected-head"])
def test_many_writers_lose_nothing(kind: str, layout: str, tmp_path: Path,
                                   request: pytest.FixtureRequest) -> None:
    target = _target(kind, tmp_path, request)
    store = _open(target)
    cfgs = []
    first_head = None
    if layout == "expected-head":  # every writer's first save expects this head: all but one
        first_head = store.save("shared", make_state(-1, 0)).id  # of them must conflict
    for w in range(WRITERS):
        thread = f"t{w}" if layout == "own-thread" else "shared"
        cfgs.append({**target, "role": "writer", "writer": w, "threads": [thread], "n": SAVES,
                     "expected": layout == "expected-head", "first_head": first_head})
    results = run_all(cfgs)
    acked = [(t, cid) for r in results for t, cid, _ in r.acked]
    errors = [e for r in results for e in r.errors]
    conflicts = sum(r.conflicts for r in results)
    found = check_store(_open(target), acked)
    attempted = WRITERS * SAVES
    print(f"\n[soak] writers {kind}/{layout}: saves attempted {attempted}, acknowledged "
          f"{len(acked)}, found {found}, conflicts raised {conflicts}, errors {len(errors)}")
    assert not errors, errors[:3]
    assert len(acked) == attempted
    assert found == attempted + (1 if first_head else 0)
    if layout == "expected-head":
        assert conflicts >= WRITERS - 1


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_readers_see_complete_states_and_never_block_writers(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Readers load the head in a loop while writers save; every state a reader gets is
    complete (its checksum holds) and is one a writer saved. Midway every reader is frozen
    (SIGSTOP) and the writers still finish: a reader holds nothing a writer waits for."""
    target = _target(kind, tmp_path, request)
    stop = tmp_path / "stop"
    n_readers, n_writers, saves = soak(2, 3), soak(2, 4), soak(8, 40)
    readers = [spawn({**target, "role": "reader", "thread": "t", "stop_file": str(stop)})
               for _ in range(n_readers)]
    for p in readers:  # wait until each reader is up, then let writers go
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    first = [spawn({**target, "role": "writer", "writer": w, "threads": ["t"], "n": saves,
                    "pad": 2000}) for w in range(n_writers)]
    first_res = [finish(p) for p in first]
    for p in readers:
        os.kill(p.pid, signal.SIGSTOP)
    frozen = [spawn({**target, "role": "writer", "writer": 100 + w, "threads": ["t"],
                     "n": saves // 2}) for w in range(n_writers)]
    frozen_res = [finish(p) for p in frozen]  # would hang if a frozen reader held a lock
    for p in readers:
        os.kill(p.pid, signal.SIGCONT)
    stop.touch()
    reader_res = [finish(p) for p in readers]
    writers = first_res + frozen_res
    for r in writers + reader_res:
        assert r.done and r.returncode == 0, r.stderr[-2000:]
    attempted = set().union(*(r.attempted for r in writers))
    seen = set().union(*(r.seen for r in reader_res))
    acked = [(t, cid) for r in writers for t, cid, _ in r.acked]
    found = check_store(_open(target), acked)
    loads = sum(r.loads for r in reader_res)
    print(f"\n[soak] readers {kind}: saves attempted {len(attempted)}, acknowledged "
          f"{len(acked)}, found {found}; {n_readers} readers loaded {loads} times, "
          f"{len(seen)} distinct states, all complete")
    assert seen and seen <= attempted
    assert len(acked) == len(attempted) == found
