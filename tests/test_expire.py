"""Thread expiry (issue 34): ``expire(idle_for=...)`` deletes the refs of idle threads by
compare-and-swap, keeps a thread saved to meanwhile, keeps labelled/tagged threads on request;
gc then reclaims their bytes; on S3 it costs a bounded number of requests per thread and lists
no more than gc does."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from builders import run_cli, run_json
from test_packs import S3Requests

from cas_checkpoint import AsyncCheckpointStore, CheckpointStore, InvalidArgumentError
from cas_checkpoint.engine.steps import DeleteRef, Step
from cas_checkpoint.maintenance import expire as expiry

IDLE = timedelta(seconds=1)


def _age(seconds: float = 1.6) -> None:
    time.sleep(seconds)  # (the threads saved before this are idle for IDLE; no timing asserted)


def _mem() -> CheckpointStore:
    return CheckpointStore.open(f"memory://expire-{uuid.uuid4().hex[:8]}")


def test_expire_deletes_idle_threads_and_gc_reclaims_them() -> None:
    store = _mem()
    for i in range(3):
        for j in range(17):  # 17: one thread's newest entry in a head, 16: in a log segment
            store.save(f"old{i}", {"n": list(range(j * 50)), "who": f"old{i}"})
    store.save("labelled", {"x": 1}, label="keep")
    store.save("tagged", {"x": 2}, tags=["milestone"])
    _age()
    store.save("fresh", {"y": 2})
    before = store.storage_bytes()
    dry = store.expire(idle_for=IDLE, dry_run=True, keep_labeled=True, keep_tags=["milestone"])
    assert sorted(dry.expired) == ["old0", "old1", "old2"]
    assert dry.kept == {"recent": 1, "saved_meanwhile": 0, "labeled": 1, "tagged": 1,
                        "grouped": 0}
    assert dry.checkpoints == 51 and "would expire 3 threads" in dry.to_text()
    assert store.threads() == ["fresh", "labelled", "old0", "old1", "old2", "tagged"]
    report = store.expire(idle_for=IDLE, keep_labeled=True, keep_tags=["milestone"])
    assert sorted(report.expired) == ["old0", "old1", "old2"]
    assert store.threads() == ["fresh", "labelled", "tagged"]
    gc = store.gc(grace=timedelta(0))
    assert gc.deleted and store.storage_bytes() < before / 4
    assert store.load("fresh").state == {"y": 2} and store.load("labelled").state == {"x": 1}
    assert store.verify().ok
    # without keep_labeled (the default) and keep_tags, labelled and tagged threads go too
    _age()
    assert sorted(store.expire(idle_for=IDLE).expired) == ["fresh", "labelled", "tagged"]
    assert store.threads() == []


def test_a_thread_saved_to_while_expire_runs_is_kept() -> None:
    """The save lands between expire's read of the ref and its conditional delete."""
    store = _mem()
    store.save("t", {"v": 1})
    store.save("u", {"v": 1})
    _age()
    other = CheckpointStore.open(store.url)  # another process, as far as caches go
    step: Step[expiry.ExpireReport] = store._upkeep.expire(idle_for=IDLE)
    raced = []
    value: Any = None
    error: Exception | None = None
    while True:  # the sync driver (steps.run), with a save before the delete
        try:
            op = step.send(value) if error is None else step.throw(error)
        except StopIteration as stop:
            report = stop.value
            break
        value = error = None
        if isinstance(op, DeleteRef) and not raced:
            raced.append(other.save("t", {"v": 2}))
        try:
            value = op.sync(store.backend)
        except Exception as exc:  # noqa: BLE001 - handed to the step, as the driver does
            error = exc
    assert raced and report.kept["saved_meanwhile"] == 1 and list(report.expired) == ["u"]
    assert store.threads() == ["t"]
    assert CheckpointStore.open(store.url).load("t").state == {"v": 2}
    assert CheckpointStore.open(store.url).count("t") == 2


def test_threads_of_one_group_expire_together() -> None:
    """``group`` maps threads to a key: they go only when all of them are idle (the command
    line and the LangGraph saver group a LangGraph thread's namespaces so)."""
    store = _mem()
    for t in ("s1/main", "s1/sub", "s2/main", "s2/sub", "alone"):
        store.save(t, {"t": t})
    _age()
    store.save("s1/sub", {"t": "again"})  # s1 is active through one of its threads

    def session(thread: str) -> str | None:
        return thread.split("/")[0] if "/" in thread else None

    report = store.expire(idle_for=IDLE, group=session)
    assert sorted(report.expired) == ["alone", "s2/main", "s2/sub"]
    assert report.kept["grouped"] == 1 and report.kept["recent"] == 1
    assert store.threads() == ["s1/main", "s1/sub"]


def test_cli_expire_keeps_a_langgraph_threads_namespaces_together(tmp_path: Any) -> None:
    from cas_checkpoint.integrations.langgraph_threads import name_of

    url = str(tmp_path / "lg")
    store = CheckpointStore.open(url)
    for thread in ("active", "idle"):
        store.save(name_of(thread, ""), {"root": thread})
        store.save(name_of(thread, "sub:1"), {"sub": thread})
    _age()
    store.save(name_of("active", ""), {"root": "again"})  # its subgraph namespace is idle
    got = run_json("expire", url, "--idle", "1s")
    assert sorted(got["expired"]) == sorted([name_of("idle", ""), name_of("idle", "sub:1")])
    assert got["kept"]["grouped"] == 1
    assert sorted(CheckpointStore.open(url).threads()) == sorted(
        [name_of("active", ""), name_of("active", "sub:1")])


def test_expire_checks_its_arguments() -> None:
    store = _mem()
    with pytest.raises(InvalidArgumentError, match="idle_for=timedelta"):
        store.expire(idle_for=30)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="idle_for"):
        store.expire(idle_for=timedelta(days=-1))
    with pytest.raises(InvalidArgumentError, match="keep_tags"):
        store.expire(idle_for=IDLE, keep_tags="milestone")


def test_expire_one_thread_and_the_async_face() -> None:
    store = _mem()
    store.save("a", {"x": 1})
    store.save("b", {"x": 1})
    _age()
    assert list(store.expire(idle_for=IDLE, thread_id="a").expired) == ["a"]
    assert store.threads() == ["b"]

    async def go() -> list[str]:
        face = await AsyncCheckpointStore.open(store.url)
        return list((await face.expire(idle_for=IDLE)).expired)

    assert asyncio.run(go()) == ["b"]


def test_cli_expire(tmp_path: Any) -> None:
    url = str(tmp_path / "s")
    store = CheckpointStore.open(url)
    store.save("a", {"x": 1})
    store.save("b", {"x": 2}, label="L")
    _age()
    code, out, err = run_cli("expire", url, "--idle", "1s", "--dry-run")
    assert code == 0, err
    assert out.splitlines()[0].startswith("total: would expire 2 threads")
    assert "-v lists each thread" in out
    assert run_json("expire", url, "--idle", "1s", "--keep-labeled")["expired"] == ["a"]
    code, out, err = run_cli("expire", url, "--idle", "1s", "-v")
    assert code == 0 and "b: 1 checkpoint" in out
    code, out, err = run_cli("expire", url)
    assert code != 0 and "--idle" in err
    assert CheckpointStore.open(url).threads() == []


def test_expire_on_s3_costs_a_bounded_number_of_requests_per_thread(
        moto_server: dict[str, Any]) -> None:
    """24 idle threads (one with its newest entry in a log segment) and 6 fresh ones: expire
    reads each idle ref once (one batched read), the one segment's pack, and deletes each idle
    ref with one conditional request; it lists refs once and the clock probe's folder once
    (gc lists those and the packs)."""
    url = f"s3://{moto_server['bucket']}/expire-{uuid.uuid4().hex[:8]}"
    store = CheckpointStore.open(url, storage_options=moto_server["storage_options"])
    for j in range(16):
        store.save("long", {"j": j})
    for i in range(23):
        store.save(f"idle{i}", {"i": i})
    _age(2.2)  # (S3 keeps modified times to the second)
    for i in range(6):
        store.save(f"fresh{i}", {"i": i})
    fresh = CheckpointStore.open(url, storage_options=moto_server["storage_options"])
    counter = S3Requests(fresh)
    try:
        report = fresh.expire(idle_for=IDLE)
        ops = Counter(counter.take())
        fresh.gc(grace=timedelta(seconds=1), force=True)
        gc_ops = Counter(counter.take())
    finally:
        counter.close()
    assert len(report.expired) == 24 and report.kept["recent"] == 6
    assert ops["ListObjectsV2"] <= gc_ops["ListObjectsV2"]
    assert ops["ListObjectsV2"] <= 2
    idle = len(report.expired)
    # per idle thread: one GET of its ref (a batched read) and one conditional DELETE; once per
    # run: the clock probe (PUT, LIST, DELETE), the listing of refs, the one log segment's
    # pack, and the backend's one-off check that conditional writes hold (PUTs and DELETEs)
    assert ops["GetObject"] <= idle + 1 and ops["DeleteObject"] <= idle + 2, ops
    assert sum(ops.values()) <= 2 * idle + 10, ops
    assert fresh.threads() == [f"fresh{i}" for i in range(6)]
