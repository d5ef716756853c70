"""``cas-checkpoint demo``: what the store is for, on one screen. A 200-step tool-calling agent,
a fork and a rewind; the bytes stored beside a copy-per-checkpoint store (SQLite rows of
msgpack, as LangGraph's savers keep them) written in the same run; the forked thread's graph;
a diff of two neighbours; verify.

The demo never replaces a thread it did not write: every checkpoint it saves carries the
metadata ``{"demo": True}``. A second run replaces the demo's two threads when each of their
checkpoints carries that mark (the same command run again); when a thread of either name holds
anything else, it refuses (exit 2) before writing anything."""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
from datetime import timedelta
from typing import Any

import msgpack

from cas_checkpoint import CheckpointId
from cas_checkpoint.cli.common import OK, PROBLEMS, CliError, open_store
from cas_checkpoint.cli.render import graph, info_line
from cas_checkpoint.humanize import human_bytes

MAIN, FORK = "support-agent", "support-agent/what-if"
MADE_BY = {"demo": True}  # in every checkpoint the demo saves: its mark
STEPS, FORK_AT, FORK_STEPS, REWIND = 200, 120, 10, 5
TOPICS = ["refund policy", "CSV export quota", "SSO login loop", "invoice currency",
          "webhook retries", "data residency", "API rate limits", "seat pricing"]


def _message(i: int, branch: str = "") -> dict[str, Any]:
    topic = TOPICS[(i // 4) % len(TOPICS)]
    kind = i % 4
    if kind == 0:
        return {"role": "user", "content": f"{branch}Question {i // 4 + 1}: how does our "
                f"{topic} work for an enterprise customer on the annual plan? " * 2}
    if kind == 1:
        return {"role": "assistant", "content": "",
                "tool_calls": [{"id": f"call_{i}", "name": "search_docs",
                                "args": {"query": topic, "top_k": 3}}]}
    if kind == 2:
        return {"role": "tool", "tool_call_id": f"call_{i - 1}", "name": "search_docs",
                "content": "\n".join(f"[{k}] {topic}, section {k}.{i % 7}: " + "the clause, "
                                      "its conditions and a worked example. " * 8
                                      for k in (1, 2, 3))}
    return {"role": "assistant", "content": f"{branch}Here is how {topic} works: "
            + "a grounded answer citing [1]. " * 5}


class _CopyStore:
    """A copy per checkpoint, measured: one SQLite row of msgpack per checkpoint."""

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder, "copies.sqlite")
        self.db = sqlite3.connect(self.path)
        self.db.execute("CREATE TABLE checkpoints (thread TEXT, id TEXT, state BLOB)")

    def save(self, thread: str, cid: str, state: Any) -> None:
        self.db.execute("INSERT INTO checkpoints VALUES (?, ?, ?)",
                        (thread, cid, msgpack.packb(state)))

    def size(self) -> int:
        self.db.commit()
        self.db.execute("VACUUM")
        self.db.close()
        return os.path.getsize(self.path)


def _own_threads(store: Any) -> list[str]:
    """The demo's threads this store holds, each written by the demo alone; CliError when a
    thread of the demo's names holds a checkpoint the demo did not save."""
    present = [t for t in (MAIN, FORK) if store.head(t) is not None]
    theirs = [t for t in present if any(
        {k: i.metadata.get(k) for k in MADE_BY} != MADE_BY for i in store.history(t))]
    if theirs:
        names = " and ".join(repr(t) for t in theirs)
        raise CliError(
            f"{store.url} already holds {names}, the thread name(s) the demo writes, with "
            "checkpoints the demo did not save; the demo would replace them, so it wrote "
            "nothing. Run it on an empty folder (`cas-checkpoint demo ./another-folder`), or "
            "delete them first (`cas-checkpoint delete-thread STORE THREAD`)")
    return present


def cmd_demo(args: argparse.Namespace) -> int:
    store = open_store(args, create=True)
    mine = _own_threads(store)  # (raises, before anything is written, on a thread not ours)
    for thread in mine:  # a second run starts afresh
        store.delete_thread(thread)
    before = store.storage_bytes()
    with tempfile.TemporaryDirectory(prefix="cas-demo-") as tmp:
        copies = _CopyStore(tmp)
        state: dict[str, Any] = {"messages": [{"role": "system", "content": "You are a support "
                                               "agent. Use search_docs before answering."}],
                                 "step": 0}
        fork_at = CheckpointId("")
        for i in range(STEPS):
            state["messages"].append(_message(i))
            state["step"] = i + 1
            info = store.save(MAIN, state, metadata={"node": state["messages"][-1]["role"],
                                                     **MADE_BY},
                              label=f"answer-{(i + 1) // 4}" if i % 40 == 39 else None)
            copies.save(MAIN, info.id, state)
            if i + 1 == FORK_AT:
                fork_at = info.id
        store.fork(MAIN, fork_at, FORK)  # what if the customer had asked something else?
        branch = store.load(FORK).state
        for i in range(FORK_AT, FORK_AT + FORK_STEPS):
            branch["messages"].append(_message(i, branch="(what-if) "))
            branch["step"] = i + 1
            info = store.save(FORK, branch, metadata={"node": branch["messages"][-1]["role"],
                                                      **MADE_BY})
            copies.save(FORK, info.id, branch)
        store.rewind(MAIN, store.history(MAIN, limit=REWIND + 1)[-1].id)  # undo 5 steps
        copy_bytes = copies.size()
    collected = set(store.threads()) <= {MAIN, FORK}
    if collected:  # only the demo's threads: nothing else can be writing here
        store.repack()
        store.gc(grace=timedelta(0))
    after = store.storage_bytes()
    final = len(msgpack.packb(store.load(MAIN).state))
    saved = STEPS + FORK_STEPS
    ours = after - (0 if collected else before)
    print(f"store: {store.url}")
    print(f"{saved} checkpoints saved: a {STEPS}-step tool-calling agent ({MAIN!r}), a fork at "
          f"step {FORK_AT} ({FORK!r}, {FORK_STEPS} more steps), then a rewind of {REWIND} "
          "steps.\n")
    print(f"  {'cas_checkpoint' + (' (after gc)' if collected else ''):<42}{human_bytes(ours):>10}"
          f"   {ours / final:5.1f}x the final state")
    print(f"  {'a copy per checkpoint (SQLite, measured)':<42}{human_bytes(copy_bytes):>10}"
          f"   {copy_bytes / final:5.1f}x the final state")
    print(f"  {'final state of ' + repr(MAIN):<42}{human_bytes(final):>10}   "
          f"-> {copy_bytes / max(ours, 1):.0f}x less stored\n")
    print(f"$ cas-checkpoint log {store.url} {FORK} --graph -n 4")
    hist = store.history(FORK)
    for n, (prefix, row) in enumerate(graph(hist)):
        if row is not None and n < 4:
            print(f"{prefix}  {info_line(row, head=n == 0)}")
        elif row is not None and row.id == fork_at:
            print("   ...")
            print(f"{prefix}  {info_line(row, extra=f'<- also in {MAIN!r}')}")
            break
    a, b = hist[1], hist[0]
    diff = store.diff(a.id, b.id)
    print(f"\n$ cas-checkpoint diff {store.url} {a.id[:12]} {b.id[:12]}")
    for change in diff.changes:
        text = repr(change.new if change.op != "removed" else change.old)
        sign = {"added": "+", "removed": "-"}.get(change.op, "~")
        print(f"{sign} state{change.path} = {text[:90]}{'...' if len(text) > 90 else ''}")
    print(f"({diff.nodes_read} tree nodes read, not two {human_bytes(b.size)} states)")
    report = store.verify()
    print(f"\n$ cas-checkpoint verify {store.url}")
    lines = report.to_text().splitlines()
    print("\n".join(lines[1:2] + lines[-1:]))
    return OK if report.ok else PROBLEMS

