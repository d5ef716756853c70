"""gc while writers are active (real processes, local disk and S3 on a moto server), and a
hypothesis state machine of save/fork/rewind/delete/prune/gc against a plain-Python model.

Size from ``CAS_SOAK``: ``small`` (the default, what CI runs) or ``full``.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from _soak import FULL, check_state, check_store, finish, make_state, spawn
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cas_checkpoint import CheckpointStore, NotFoundError
from cas_checkpoint.engine.object_store import key_pack_id

SOAK = "full" if FULL else "small"


def pool_state(i: int, scale: float = 1.0) -> dict[str, Any]:
    """A small pool of states; big ones split into several nodes that share with each other."""
    n = max(1, round([2, 5, 40, 120, 300, 40, 5, 2][i % 8] * scale))
    return {"messages": [{"role": "user", "content": f"message {k} " * 12} for k in range(n)],
            "step": i % 8, "scale": scale}


# --- writer processes --------------------------------------------------------------------------


def writer(url: str, options: dict[str, Any] | None, name: str, stop: Any, seed: int,
           out: Any, pause: float = 0.0, scale: float = 1.0) -> None:
    """Save (from the pool, so orphaned objects get reused), fork, rewind, delete, prune and
    delete threads until ``stop`` is set; report (name, saves, ops) on ``out``."""
    rnd = random.Random(seed)
    store = CheckpointStore.open(url, storage_options=options, keep_last=24)
    mine = [f"{name}-0"]
    saves = ops = 0
    while not stop.wait(pause):
        t = rnd.choice(mine)
        r = rnd.random()
        try:
            if r < 0.7 or store.head(t) is None:
                store.save(t, pool_state(rnd.randrange(8), scale),
                           label="x" if r < 0.02 else None)
                saves += 1
            elif r < 0.78:
                hist = store.history(t)
                store.rewind(t, rnd.choice(hist).id)
            elif r < 0.84 and len(mine) < 6:
                hist = store.history(t)
                new = f"{name}-{uuid.uuid4().hex[:6]}"
                store.fork(t, rnd.choice(hist).id, new)
                mine.append(new)
            elif r < 0.90:
                hist = store.history(t)
                if len(hist) > 1:
                    store.delete(t, rnd.choice(hist).id)
            elif r < 0.95 and len(mine) > 1 and t != mine[0]:  # the first one stays: the
                store.delete_thread(t)  # soak waits for it to appear
                mine.remove(t)
            else:
                store.prune(t, keep_last=rnd.randrange(0, 6))
            ops += 1
        except NotFoundError:
            pass
    out.put((name, saves, ops))


def check_all(url: str, options: dict[str, Any] | None) -> int:
    """Every checkpoint in every ref loads (from a store with an empty cache). The refs are
    read once; each checkpoint is loaded from the packs its ref named then: writers may move
    their refs meanwhile, but only gc deletes packs, and gc does not run during the check."""
    store = CheckpointStore.open(url, storage_options=options)
    todo = []
    for thread in store.threads():
        ref = store.refs.read(thread)
        if ref is None:  # deleted since threads() was listed
            continue
        todo += [(ref.head, e.id) for e in store.refs.entries(ref.head)]

    def one(item: tuple[Any, str]) -> None:
        head, cid = item
        cp = store._core.decode(store.objects.view(head), cid, head.thread_id)
        assert cp.state == pool_state(cp.state["step"], cp.state["scale"]), cid

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, todo))
    return len(todo)


def soak(url: str, options: dict[str, Any] | None, *, writers: int, rounds: int,
         graces: list[float], pause: float = 0.0, gap: float = 0.1,
         scale: float = 1.0) -> dict[str, int]:
    """``writers`` processes write while this one runs ``rounds`` gc rounds, loading every
    checkpoint in every ref after each. A grace of 0 is left out on purpose: it is safe only
    with no writer between writing its objects and committing its ref (README, "How GC stays
    safe")."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    gc_store = CheckpointStore.open(url, storage_options=options)
    gc_store.save("warm", pool_state(0))  # creates the bucket prefix / directory
    stop = ctx.Event()
    procs = [ctx.Process(target=writer, args=(url, options, f"w{i}", stop, i, out, pause,
                                              scale), daemon=True) for i in range(writers)]
    for p in procs:
        p.start()
    totals = {"rounds": 0, "deleted": 0, "refreshed": 0, "verified": 0, "saves": 0, "ops": 0}
    try:
        deadline = time.monotonic() + 120
        while not all(f"w{i}-0" in gc_store.threads() for i in range(writers)):
            assert time.monotonic() < deadline, "the writers did not start"
            time.sleep(0.2)
        for r in range(rounds):
            time.sleep(gap)  # let the writers make garbage and reuse it
            report = gc_store.gc(grace=timedelta(seconds=graces[r % len(graces)]))
            totals["rounds"] += 1
            totals["deleted"] += report.deleted_objects
            totals["refreshed"] += report.refreshed_objects
            totals["verified"] += check_all(url, options)
            assert all(p.is_alive() for p in procs), "a writer died"
    finally:
        stop.set()
        for _ in procs:
            _name, saves, ops = out.get(timeout=60)
            totals["saves"] += saves
            totals["ops"] += ops
        for p in procs:
            p.join(10)
    # a last round with the writers stopped: everything unreachable goes, the rest loads
    if url.startswith("s3://"):
        time.sleep(1.1)  # LastModified has a resolution of one second
    totals["deleted"] += gc_store.gc(grace=timedelta(0), force=True).deleted_objects
    totals["verified"] += check_all(url, options)
    assert gc_store.gc(grace=timedelta(0), force=True, dry_run=True).deleted_objects == 0
    return totals


def _report(kind: str, totals: dict[str, int]) -> None:
    print(f"\nsoak[{kind}] {SOAK}: " + ", ".join(f"{k} {v}" for k, v in totals.items()))


def test_gc_while_writer_processes_write_local(tmp_path: Any) -> None:
    url = str(tmp_path / "soak")
    totals = soak(url, None, writers=3 if FULL else 2, rounds=150 if FULL else 12,
                  graces=[0.25, 0.5, 1.0, 2.0])
    _report("local", totals)
    assert totals["rounds"] >= (150 if FULL else 12) and totals["deleted"] > 0


def test_gc_while_writer_processes_write_s3(moto_server: dict[str, Any]) -> None:
    url = f"s3://{moto_server['bucket']}/soak-{uuid.uuid4().hex[:8]}"
    # moto runs in this process and serves every request slowly: smaller states, and the
    # writers slowed down a little to leave it room
    totals = soak(url, moto_server["storage_options"], writers=2, rounds=60 if FULL else 4,
                  graces=[1.0, 2.0], pause=0.02, gap=0.5 if FULL else 1.0,
                  scale=0.3 if FULL else 0.1)
    _report("s3", totals)
    assert totals["rounds"] >= (60 if FULL else 4) and totals["saves"] > 0


# --- gc of merged-away packs while writer processes save -------------------------------------


def _packs(store: CheckpointStore) -> dict[str, float]:
    """Every stored pack and its modified time (by the storage's clock)."""
    return {p: i.mtime for i in store.backend.list("packs") if (p := key_pack_id(i.key))}


def _named(store: CheckpointStore) -> set[str]:
    out: set[str] = set()
    for thread in store.threads():
        ref = store.refs.read(thread)
        if ref is not None:
            out |= {p.id for p in ref.head.packs}
    return out


def _check_refs(url: str, options: dict[str, Any] | None) -> int:
    """Every checkpoint of every ref loads, complete, from the packs that ref named when read
    (only gc deletes packs, and gc does not run during the check)."""
    store = CheckpointStore.open(url, storage_options=options)
    n = 0
    for thread in store.threads():
        ref = store.refs.read(thread)
        if ref is None:
            continue
        view = store.objects.view(ref.head)
        for entry in store.refs.entries(ref.head):
            check_state(store._core.decode(view, entry.id, thread).state)
            n += 1
    return n


def merge_soak(url: str, options: dict[str, Any] | None, *, writers: int, saves: int,
               grace: float, pad: int = 300) -> dict[str, int]:
    """``writers`` processes each make ``saves`` saves over two shared threads and one of
    their own, every save flushing a pack (``inline_max=1``) so merges run all the time and
    leave merged-away packs behind; meanwhile this process runs gc with ``grace`` in a loop
    and loads every checkpoint of every ref after each round. Afterwards every acknowledged
    save is in its thread and loads; a gc with a long grace keeps every merged-away pack; once
    they are older than ``grace``, a gc deletes exactly them."""
    store = CheckpointStore.open(url, storage_options=options)
    store.save("warm", make_state(99, 0))  # creates the bucket prefix / directory
    procs = [spawn({"url": url, "storage_options": options, "role": "writer", "writer": w,
                    "threads": ["shared-0", "shared-1", f"own-{w}"], "n": saves, "pad": pad,
                    "inline_max": 1}) for w in range(writers)]
    totals = {"rounds": 0, "deleted_live": 0, "refreshed": 0, "verified": 0}
    with ThreadPoolExecutor(len(procs)) as pool:  # read their pipes while gc runs
        futures = [pool.submit(finish, p) for p in procs]
        while not all(f.done() for f in futures):
            report = store.gc(grace=timedelta(seconds=grace))
            totals["rounds"] += 1
            totals["deleted_live"] += report.deleted_objects
            totals["refreshed"] += report.refreshed_objects
            totals["verified"] += _check_refs(url, options)
            time.sleep(0.05)
        results = [f.result() for f in futures]
    for r in results:
        assert r.done and r.returncode == 0 and not r.errors, (r.errors[:3], r.stderr[-2000:])
    acked = [(t, cid) for r in results for t, cid, _ in r.acked]
    assert len(acked) == writers * saves
    fresh = CheckpointStore.open(url, storage_options=options)
    totals["checkpoints"] = check_store(fresh, acked)  # each acknowledged save, loaded
    merged = sum(p.level > 0 for t in fresh.threads()
                 for p in fresh.refs.read(t).head.packs)  # type: ignore[union-attr]
    assert merged > 0

    garbage = set(_packs(fresh)) - _named(fresh)
    assert garbage, "the writers' last merges left no merged-away pack"
    kept = fresh.gc(grace=timedelta(hours=1))  # all of it is younger than that: kept
    assert kept.deleted_objects == 0 and kept.young_objects >= len(garbage)
    assert garbage <= set(_packs(fresh))
    time.sleep(grace + (1.1 if url.startswith("s3://") else 0.05))
    report = fresh.gc(grace=timedelta(seconds=grace))
    assert set(report.deleted) == garbage  # older than the grace now: deleted, and only them
    assert set(_packs(fresh)) == _named(fresh)
    totals["deleted_after"] = report.deleted_objects
    assert check_store(CheckpointStore.open(url, storage_options=options), acked) == \
        totals["checkpoints"]
    return totals


def test_gc_of_merged_packs_while_writer_processes_save_local(tmp_path: Any) -> None:
    totals = merge_soak(str(tmp_path / "merge"), None, writers=3, saves=120 if FULL else 40,
                        grace=0.25)
    _report("merge local", totals)
    if FULL:  # at CI size whether a round meets a merged-away pack past its grace is timing;
        # the exact deletion after the writers stop is asserted in merge_soak either way
        assert totals["deleted_live"] > 0  # merged-away packs went while the writers wrote


def test_gc_of_merged_packs_while_writer_processes_save_s3(moto_server: dict[str, Any]) -> None:
    url = f"s3://{moto_server['bucket']}/merge-{uuid.uuid4().hex[:8]}"
    totals = merge_soak(url, moto_server["storage_options"], writers=2,
                        saves=80 if FULL else 25, grace=1.0)
    _report("merge s3", totals)
    assert totals["rounds"] > 1


# --- a state machine against a plain-Python model ----------------------------------------------


class Model(RuleBasedStateMachine):
    """Which checkpoints must stay loadable, and with which state, after each step."""

    url = ""
    inline_max: int | None = None  # tiny: a pack every save, merges all the time

    def __init__(self) -> None:
        super().__init__()
        self.store = CheckpointStore.open(self.url + uuid.uuid4().hex[:10])
        if self.inline_max is not None:
            self.store.refs.inline_max = self.inline_max
        self.logs: dict[str, list[str]] = {}  # thread -> checkpoint ids in log order
        self.heads: dict[str, str] = {}
        self.parent: dict[str, str | None] = {}
        self.states: dict[str, int] = {}  # checkpoint -> pool index
        self.labeled: set[str] = set()

    def _pick(self, data: Any) -> tuple[str, str]:
        t = data.draw(st.sampled_from(sorted(self.logs)))
        return t, data.draw(st.sampled_from(self.logs[t]))

    @rule(thread=st.sampled_from(["a", "b", "c"]), s=st.integers(0, 7), label=st.booleans())
    def save(self, thread: str, s: int, label: bool) -> None:
        info = self.store.save(thread, pool_state(s), label="L" if label else None)
        self.parent[info.id] = self.heads.get(thread)
        assert info.parent_ids == ((self.heads[thread],) if thread in self.heads else ())
        self.logs.setdefault(thread, []).append(info.id)
        self.heads[thread] = info.id
        self.states[info.id] = s
        if label:
            self.labeled.add(info.id)

    @precondition(lambda self: self.logs)
    @rule(data=st.data(), new=st.sampled_from(["f1", "f2", "f3"]))
    def fork(self, data: Any, new: str) -> None:
        t, cid = self._pick(data)
        if new in self.logs:
            return
        self.store.fork(t, cid, new)
        keep, c = set(), cid
        while c is not None and c in self.logs[t]:
            keep.add(c)
            c = self.parent[c]
        self.logs[new] = [e for e in self.logs[t] if e in keep]
        self.heads[new] = cid

    @precondition(lambda self: self.logs)
    @rule(data=st.data())
    def rewind(self, data: Any) -> None:
        t, cid = self._pick(data)
        self.store.rewind(t, cid)
        self.logs[t] = self.logs[t][: self.logs[t].index(cid) + 1]
        self.heads[t] = cid

    @precondition(lambda self: self.logs)
    @rule(data=st.data())
    def delete(self, data: Any) -> None:
        t, cid = self._pick(data)
        self.store.delete(t, cid)
        kept = [e for e in self.logs[t] if e != cid]
        if not kept:
            del self.logs[t], self.heads[t]
            return
        if self.heads[t] == cid:
            p = self.parent[cid]
            self.heads[t] = p if p in kept else kept[-1]
        self.logs[t] = kept

    @precondition(lambda self: self.logs)
    @rule(data=st.data())
    def delete_thread(self, data: Any) -> None:
        t = data.draw(st.sampled_from(sorted(self.logs)))
        self.store.delete_thread(t)
        del self.logs[t], self.heads[t]

    @precondition(lambda self: self.logs)
    @rule(data=st.data(), keep_last=st.integers(0, 4), everywhere=st.booleans())
    def prune(self, data: Any, keep_last: int, everywhere: bool) -> None:
        threads = sorted(self.logs) if everywhere else [data.draw(st.sampled_from(
            sorted(self.logs)))]
        self.store.prune(None if everywhere else threads[0], keep_last=keep_last)
        for t in threads:
            log = self.logs[t]
            self.logs[t] = [e for i, e in enumerate(log) if e == self.heads[t]
                            or e in self.labeled or i >= len(log) - keep_last]

    @rule()
    def gc(self) -> None:
        self.store.gc(grace=timedelta(0))
        assert self.store.gc(grace=timedelta(0), dry_run=True).deleted_objects == 0

    @invariant()
    def every_modelled_checkpoint_loads(self) -> None:
        s = CheckpointStore.from_backend(self.store.backend, types=self.store.types)  # no cache
        assert set(s.threads()) == set(self.logs)
        for t, log in self.logs.items():
            assert s.head(t) == self.heads[t]
            assert [c.id for c in s.history(t)] == log[::-1]
            for cid in log:
                assert s.get(cid).state == pool_state(self.states[cid])


_SM = settings(max_examples=60 if FULL else 10, stateful_step_count=40 if FULL else 20,
               deadline=None, suppress_health_check=list(HealthCheck))


class MemoryModel(Model):
    url = "memory://sm-"


class LocalModel(Model):
    url = tempfile.mkdtemp(prefix="cas-sm-") + "/sm-"


class MergingMemoryModel(Model):
    url = "memory://sm-merging-"
    inline_max = 1


TestMemoryModel = MemoryModel.TestCase
TestMemoryModel.settings = _SM
TestLocalModel = LocalModel.TestCase
TestLocalModel.settings = _SM
TestMergingMemoryModel = MergingMemoryModel.TestCase
TestMergingMemoryModel.settings = _SM
