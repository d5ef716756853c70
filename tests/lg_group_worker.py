"""A child for tests/test_lg_group_crash.py: runs an agent graph through CasSaver's async face
(group commits) on a local store, turn after turn, and prints each ``aput``/``aput_writes``
as it returns (acknowledged), until it is killed.

    python tests/lg_group_worker.py STORE_PATH THREAD SEED [CONFLICTS TURNS]

With TURNS it stops after that many turns (printing "done"); a turn that raises
``ConflictError`` (``CONFLICTS`` = raise, another process moved the thread) prints "conflict"
and the next turn goes on from the thread's latest checkpoint.
"""

from __future__ import annotations

import asyncio
import operator
import random
import sys
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from cas_checkpoint import ConflictError
from cas_checkpoint.integrations.langgraph import CasSaver


class State(TypedDict, total=False):
    items: Annotated[list[str], operator.add]
    n: int


class Acking(CasSaver):
    """Prints what each call acknowledged, once it returned."""

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        got = await super().aput(config, checkpoint, metadata, new_versions)
        c = got["configurable"]
        print("put", c["checkpoint_ns"] or "-", c["checkpoint_id"], flush=True)
        return got

    async def aput_writes(self, config: Any, writes: Any, task_id: str,
                          task_path: str = "") -> None:
        await super().aput_writes(config, writes, task_id, task_path)
        c = config["configurable"]
        print("writes", c["checkpoint_ns"] or "-", c["checkpoint_id"], task_id, flush=True)


def graph(saver: CasSaver, rnd: random.Random) -> Any:
    g = StateGraph(State)

    def worker(name: str) -> Any:
        def run(state: State) -> State:
            # a few KB now and then: packs are flushed and merged while kills land
            size = rnd.choice([10, 10, 3000, 9000])
            return {"items": [f"{name}{state.get('n', 0)}:" + "x" * size]}
        return run

    for name in ("a", "b", "c"):
        g.add_node(name, worker(name))
        g.add_edge(START, name)
        g.add_edge(name, "join")
    g.add_node("join", lambda s: {"n": s.get("n", 0) + 1, "items": []})
    g.add_edge("join", END)
    return g.compile(checkpointer=saver)


async def main() -> None:
    path, thread, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    conflicts = sys.argv[4] if len(sys.argv) > 4 else "keep"
    turns = int(sys.argv[5]) if len(sys.argv) > 5 else None
    rnd = random.Random(seed)
    saver = Acking.from_url(path, conflicts=conflicts)
    app = graph(saver, rnd)
    config = {"configurable": {"thread_id": thread}}
    print("ready", flush=True)
    done = 0
    while turns is None or done < turns:
        try:
            await app.ainvoke({"items": []}, config)
        except ConflictError:
            print("conflict", flush=True)
        done += 1
    print("done", flush=True)


asyncio.run(main())
