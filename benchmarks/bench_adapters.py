"""The framework adapters (issue 32) beside each framework's own backends, one table per
framework, measured in one run.

Workload: a conversation of ``--turns`` turns (200 by default) on one session, each turn a user
message and an assistant answer of ~380 bytes of seeded text, written through the framework's
storage interface (no model, no runner: the storage is what is measured):

* Google ADK: two ``append_event`` calls a turn on the session ``create_session`` returned;
  ours (``CasSessionService``) beside ``InMemorySessionService`` and ``SqliteSessionService``;
* OpenAI Agents SDK: one ``add_items([user, answer])`` a turn; ``CasSession`` beside
  ``SQLiteSession(":memory:")`` and ``AdvancedSQLiteSession`` (the SQLite session with branches);
* Pydantic AI: ``load`` then ``save`` of the conversation a turn (as an app does around each
  run); ``CasConversationStore`` beside ``InMemoryConversationStore`` (the package has no other).

Columns: bytes stored at the end, after ``gc(repack=True)`` for ours and ``VACUUM`` for SQLite
(its file and its write-ahead log, checkpointed; a local store's ref files count as the files
they are); the median ms of a turn; S3 requests per turn (ours on ``s3://`` against a moto
server on 127.0.0.1: every aiobotocore API call, so a GET, a PUT or a LIST counts once); the
requests of a cold resume (a new process reads the whole session: ``get_session``,
``get_items``, ``load``); and what a branch at the middle turn adds, in bytes stored (ours:
``fork_session``, ``branch_from_turn``, ``fork``; ``AdvancedSQLiteSession``'s
``create_branch_from_turn``, which copies rows).
Times on S3 are moto's on loopback, not a real region's.

    python benchmarks/bench_adapters.py                 # 200 turns
    python benchmarks/bench_adapters.py --turns 20      # quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import human, median, message, moto_s3, s3_size, table, tree_size, version  # noqa: E402

S3_CALLS: Counter[str] = Counter()


def count_s3() -> None:
    from aiobotocore.client import AioBaseClient  # type: ignore[import-untyped]

    orig = AioBaseClient._make_api_call

    async def counted(client: Any, operation_name: str, api_params: Any) -> Any:
        S3_CALLS[operation_name] += 1
        return await orig(client, operation_name, api_params)

    AioBaseClient._make_api_call = counted


def texts(n: int) -> list[tuple[str, str]]:
    rng = random.Random(32)
    return [(message(2 * i, rng)["content"], message(2 * i + 1, rng)["content"])
            for i in range(n)]


# --- one case: open, turns, resume, branch (kind: cas-local, cas-s3, or a peer's name) ---

async def adk_case(kind: str, url: str, opts: dict[str, Any] | None, db: str,
                   turns: list[tuple[str, str]]) -> tuple[list[float], Any, Any]:
    from google.adk.events import Event
    from google.adk.sessions import InMemorySessionService
    from google.adk.sessions.sqlite_session_service import SqliteSessionService
    from google.genai import types

    from cas_checkpoint.integrations.adk import CasSessionService

    service: Any = (CasSessionService(url, storage_options=opts) if kind.startswith("cas")
                    else InMemorySessionService() if kind == "in-memory"
                    else SqliteSessionService(db))
    s = await service.create_session(app_name="bench", user_id="u", session_id="s")
    times, middle = [], None
    for i, (q, a) in enumerate(turns):
        t0 = time.perf_counter()
        for role, text in (("user", q), ("model", a)):
            ev = Event(author=role, invocation_id=f"inv{i}",
                       content=types.Content(role=role, parts=[types.Part(text=text)]))
            await service.append_event(s, ev)
        times.append(time.perf_counter() - t0)
        if i == len(turns) // 2:
            middle = s.events[-1].id

    async def branch() -> None:
        await service.fork_session(app_name="bench", user_id="u", session_id="s",
                                   new_session_id="b", at_event_id=middle)

    async def done() -> None:
        if kind.startswith("cas"):
            await service.close()

    return times, (branch if kind.startswith("cas") else None), done


async def agents_case(kind: str, url: str, opts: dict[str, Any] | None, db: str,
                      turns: list[tuple[str, str]]) -> tuple[list[float], Any, Any]:
    from agents import SQLiteSession
    from agents.extensions.memory import AdvancedSQLiteSession

    from cas_checkpoint.integrations.openai_agents import CasSession

    session: Any = (CasSession("s", url, storage_options=opts or {}) if kind.startswith("cas")
                    else SQLiteSession("s") if kind == "sqlite-memory"
                    else AdvancedSQLiteSession(session_id="s", db_path=db, create_tables=True))
    times = []
    for q, a in turns:
        t0 = time.perf_counter()
        await session.add_items([{"role": "user", "content": q},
                                 {"role": "assistant", "content": a}])
        times.append(time.perf_counter() - t0)
    mid = len(turns) // 2 + 1

    async def branch() -> None:
        if kind.startswith("cas"):
            await session.branch_from_turn(mid, "b")
        else:
            await session.create_branch_from_turn(mid, "b")

    return times, (branch if kind != "sqlite-memory" else None), None


async def pai_case(kind: str, url: str, opts: dict[str, Any] | None, db: str,
                   turns: list[tuple[str, str]]) -> tuple[list[float], Any, Any]:
    from pydantic_ai.conversation import Conversation
    from pydantic_ai.conversation_store import InMemoryConversationStore
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

    from cas_checkpoint.integrations.pydantic_ai import CasConversationStore

    store: Any = (CasConversationStore(url, storage_options=opts or {})
                  if kind.startswith("cas") else InMemoryConversationStore())
    times = []
    for q, a in turns:
        t0 = time.perf_counter()
        conv = await store.load("c") or Conversation(conversation_id="c")
        conv.messages += [ModelRequest(parts=[UserPromptPart(content=q)]),
                          ModelResponse(parts=[TextPart(content=a)])]
        await store.save(conv)
        times.append(time.perf_counter() - t0)

    async def branch() -> None:
        await store.fork("c", at=len(turns), new_conversation_id="b")

    return times, (branch if kind.startswith("cas") else None), None


CASES = {"adk": (adk_case, ["cas-local", "cas-s3", "in-memory", "sqlite"]),
         "agents": (agents_case, ["cas-local", "cas-s3", "sqlite-memory", "advanced-sqlite"]),
         "pydantic-ai": (pai_case, ["cas-local", "cas-s3", "in-memory"])}
TITLES = {"adk": f"Google ADK sessions (google-adk {version('google-adk')})",
          "agents": f"OpenAI Agents SDK sessions (openai-agents {version('openai-agents')})",
          "pydantic-ai": f"Pydantic AI conversations (pydantic-ai-slim "
                         f"{version('pydantic-ai-slim')})"}

RESUME = """
import asyncio, json, sys
sys.path.insert(0, {bench!r})
import bench_adapters as b
b.count_s3()
async def main():
    fw, url, opts = {fw!r}, {url!r}, json.loads({opts!r})
    if fw == "adk":
        from cas_checkpoint.integrations.adk import CasSessionService
        s = CasSessionService(url, storage_options=opts)
        n = len((await s.get_session(app_name="bench", user_id="u", session_id="s")).events)
        await s.close()
    elif fw == "agents":
        from cas_checkpoint.integrations.openai_agents import CasSession
        n = len(await CasSession("s", url, storage_options=opts).get_items())
    else:
        from cas_checkpoint.integrations.pydantic_ai import CasConversationStore
        n = len((await CasConversationStore(url, storage_options=opts).load("c")).messages)
    print(json.dumps([n, sum(b.S3_CALLS.values())]))
asyncio.run(main())
"""


def size_of(kind: str, url: str, db: str, opts: dict[str, Any] | None) -> int | None:
    if kind in ("in-memory", "sqlite-memory"):
        return None
    if kind in ("sqlite", "advanced-sqlite"):
        conn = sqlite3.connect(db)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
        conn.close()
        return sum(os.path.getsize(db + ext) for ext in ("", "-wal")
                   if os.path.exists(db + ext))
    if kind == "cas-s3":
        assert opts is not None
        return s3_size(opts, "bench", url.split("/", 3)[3] + "/")[0]
    return tree_size(url)[0]


def compact(kind: str, url: str, opts: dict[str, Any] | None) -> None:
    if not kind.startswith("cas"):
        return
    from cas_checkpoint import CheckpointStore

    if kind == "cas-s3":
        time.sleep(2.2)  # LastModified has a 1-second resolution
    CheckpointStore.open(url, storage_options=opts).gc(grace=timedelta(0), repack=True,
                                                       force=kind == "cas-s3")


def run_case(fw: str, kind: str, n: int, tmp: str, opts: dict[str, Any] | None) -> list[Any]:
    fn, _ = CASES[fw]
    name = uuid.uuid4().hex[:8]
    url = f"s3://bench/{fw}-{name}" if kind == "cas-s3" else os.path.join(tmp, f"{fw}-{name}")
    db = os.path.join(tmp, f"{fw}-{name}.db")
    s3 = opts if kind == "cas-s3" else None
    out: dict[str, Any] = {}

    async def case() -> None:
        S3_CALLS.clear()
        times, branch, done = await fn(kind, url, s3, db, texts(n))
        out["times"] = times
        out["requests"] = sum(S3_CALLS.values()) / n if kind == "cas-s3" else None
        if kind.startswith("cas"):
            code = RESUME.format(bench=str(Path(__file__).resolve().parent), fw=fw, url=url,
                                 opts=json.dumps(s3 or {}))
            got = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", code],
                                          capture_output=True, text=True, check=True,
                                          timeout=600)
            items, calls = json.loads(got.stdout.strip().splitlines()[-1])
            out["resume"] = calls if kind == "cas-s3" else "-"
        await asyncio.to_thread(compact, kind, url, s3)
        out["stored"] = await asyncio.to_thread(size_of, kind, url, db, s3)
        if branch is not None:
            await branch()
            after = await asyncio.to_thread(size_of, kind, url, db, s3)
            out["branch"] = (after or 0) - (out["stored"] or 0)
        if done is not None:
            await done()

    asyncio.run(case())
    stored, grown = out["stored"], out.get("branch")
    return [kind, human(stored) if stored is not None else "-",
            f"{median(out['times']) * 1000:.2f}",
            f"{out['requests']:.1f}" if out["requests"] is not None else "-",
            out.get("resume", "-"), human(grown) if grown is not None else "-"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--frameworks", default="adk,agents,pydantic-ai")
    args = ap.parse_args(argv)
    count_s3()
    print(f"{args.turns} turns a conversation; cas_checkpoint {version('cas_checkpoint')}")
    with moto_s3() as opts, tempfile.TemporaryDirectory() as tmp:
        for fw in args.frameworks.split(","):
            rows = [run_case(fw, kind, args.turns, tmp, opts) for kind in CASES[fw][1]]
            print(f"\n{TITLES[fw]}")
            print(table(["backend", "bytes after gc", "ms/turn", "S3 req/turn",
                         "cold resume req", "branch adds"], rows))


if __name__ == "__main__":
    main()
