"""Processes and CasSaver's async face's group commits: kill -9 while it group-commits an agent
graph's puts and pending writes (every call that returned is there afterwards, read by a new
saver), and two processes running one thread at once (both keep their saves, or raise)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _soak import soak
from langchain_core.runnables import RunnableConfig

from cas_checkpoint import CheckpointStore
from cas_checkpoint.integrations.langgraph import CasSaver
from cas_checkpoint.integrations.langgraph.keys import _key

KILLS = soak(6, 60)
WORKER = Path(__file__).with_name("lg_group_worker.py")


def test_acknowledged_group_commits_survive_kill_9(tmp_path: Path) -> None:
    """A child runs a fan-out graph turn after turn (3 parallel writes a step, states of a
    few bytes to 9 KB, so packs are flushed and merged) and prints each aput/aput_writes
    that returned; it is SIGKILLed at a random moment, then restarted on the same thread. After
    each kill a new saver finds every acknowledged checkpoint, with every acknowledged task's
    pending writes, and the store verifies."""
    rng = random.Random(29)
    url = str(tmp_path / "store")
    puts: list[tuple[str, str]] = []
    writes: list[tuple[str, str, str]] = []
    for kill in range(KILLS):
        proc = subprocess.Popen([sys.executable, str(WORKER), url, "t", str(kill)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", proc.stderr
        time.sleep(rng.uniform(0.05, 0.6))  # when to kill: random, not a timing assertion
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate()
        assert proc.returncode == -signal.SIGKILL, err[-2000:]
        new_puts = len(puts)
        for line in out.split("\n")[:-1]:  # the kill may cut the last line short
            p = line.split()
            if p[0] == "put" and len(p) == 3:
                puts.append((p[1], p[2]))
            elif p[0] == "writes" and len(p) == 4:
                writes.append((p[1], p[2], p[3]))
        saver = CasSaver.from_url(url)  # nothing cached
        # every acknowledged put of every round so far, with its tasks' writes: one listing
        # (a get_tuple each walked the log from its head: O(puts^2) reads, 40 of the test's
        # 48 s); get_tuple finds this round's, the newest
        found = {(_ns(t.config), str(t.config["configurable"]["checkpoint_id"])):
                 {w[0] for w in t.pending_writes or ()}
                 for t in saver.list({"configurable": {"thread_id": "t"}})}
        for ns, cid in puts:
            assert (ns, cid) in found, f"kill {kill}: acknowledged put lost"
        for ns, cid in puts[new_puts:]:
            conf: RunnableConfig = {"configurable": {
                "thread_id": "t", "checkpoint_ns": "" if ns == "-" else ns, "checkpoint_id": cid}}
            tup = saver.get_tuple(conf)
            assert tup is not None, f"kill {kill}: acknowledged put lost"
            assert {w[0] for w in tup.pending_writes or ()} == found[ns, cid]
        for ns, cid, task in writes:
            if (ns, cid) not in found:  # early writes of a checkpoint whose put never came
                assert all(c != cid for _, c in puts)
                log = saver.store.history(_key("t", "" if ns == "-" else ns))
                assert any(e.metadata.get("w") == cid and e.metadata.get("task") == task
                           for e in log), f"kill {kill}: acknowledged writes of {task} lost"
                continue
            assert task in found[ns, cid], f"kill {kill}: acknowledged writes of task {task} lost"
    assert len(puts) > KILLS and len(writes) > KILLS  # (the kills did not all come early)
    print(f"\n[soak] group commit crash: kills {KILLS}, acknowledged puts {len(puts)}, "
          f"writes {len(writes)}")
    assert CheckpointStore.open(url).verify().ok


def _ns(config: RunnableConfig) -> str:
    return str(config["configurable"].get("checkpoint_ns") or "-")


def _acked(out: str) -> tuple[list[tuple[str, str]], int]:
    puts = [(p[1], p[2]) for p in (line.split() for line in out.split("\n"))
            if len(p) == 3 and p[0] == "put"]
    return puts, out.count("conflict\n")


@pytest.mark.parametrize("mode", ["keep", "raise"])
def test_two_processes_on_one_thread(tmp_path: Path, mode: str) -> None:
    """Two processes run the fan-out graph on one thread at once, 8 turns each. ``keep``:
    every put either acknowledged is in the thread (the thread may branch); ``raise``: every
    acknowledged put too, and the thread's checkpoints form one line (each put's parent is the
    checkpoint before it: a put that was not the latest raised ConflictError instead)."""
    url = str(tmp_path / "store")
    CasSaver.from_url(url)  # (the store exists before both start)
    procs = [subprocess.Popen([sys.executable, str(WORKER), url, "t", str(k), mode, "8"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in range(2)]
    puts: list[tuple[str, str]] = []
    conflicts = 0
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0 and out.endswith("done\n"), err[-3000:]
        got, n = _acked(out)
        puts += got
        conflicts += n
    saver = CasSaver.from_url(url)
    listed = {c.config["configurable"]["checkpoint_id"]: c
              for c in saver.list({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})}
    root = [cid for ns, cid in puts if ns == "-"]
    assert set(root) <= set(listed) and len(root) >= 16
    print(f"\n[two processes, {mode}] acknowledged puts {len(puts)}, conflicts raised "
          f"{conflicts}, checkpoints {len(listed)}")
    if mode == "raise":
        parents = [c.parent_config["configurable"]["checkpoint_id"] for c in listed.values()
                   if c.parent_config is not None]
        assert len(parents) == len(set(parents)), "a checkpoint has two children"
    else:
        assert conflicts == 0
    assert CheckpointStore.open(url).verify().ok
