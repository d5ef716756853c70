"""OpenAI Agents SDK sessions on the store (cas_checkpoint.integrations.openai_agents): the SDK's
Runner with its ScriptedModel and a function tool equals a run on SQLiteSession, resumes in a
new process and branches; one more turn costs about one turn; a fork writes refs only; two
writers lose no item; S3 on moto; hostile stored data; and the SDK's own session tests
(compat/agents_suite.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents", reason="needs the openai-agents extra: "
                    "pip install -e '.[openai-agents]'")

from agents import Agent, Runner, SQLiteSession, function_tool  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from builders import present_bytes  # noqa: E402

from cas_checkpoint import CasError, CheckpointStore, FormatError  # noqa: E402
from cas_checkpoint.integrations.openai_agents import CasSession  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@function_tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def script() -> ScriptedModel:
    """Three turns: a greeting, a tool call and its answer, a goodbye."""
    return ScriptedModel([
        [assistant_message("hello")],
        [function_call("add", {"a": 2, "b": 3}, call_id="c1")],
        [assistant_message("it is 5")],
        [assistant_message("bye")],
    ])


async def converse(session: Any) -> list[str]:
    agent = Agent(name="calc", model=script(), tools=[add])
    out = []
    for text in ("hi", "what is 2 + 3?", "thanks"):
        result = await Runner.run(agent, text, session=session)
        out.append(str(result.final_output))
    return out


def test_runner_equals_sqlite_session_and_resumes_in_a_new_process(tmp_path: Path) -> None:
    url = str(tmp_path / "store")

    async def main() -> tuple[list[str], list[str], list[Any], list[Any]]:
        ours = CasSession("s1", url)
        theirs = SQLiteSession("s1", str(tmp_path / "peer.db"))
        a, b = await converse(ours), await converse(theirs)
        return a, b, await ours.get_items(), await theirs.get_items()

    a, b, ia, ib = asyncio.run(main())
    assert a == b == ["hello", "it is 5", "bye"]
    assert ia == ib and len(ia) == 8  # 3 user, 3 assistant, a call and its output
    code = f"""
import asyncio, json
from agents import Agent, Runner
from agents.testing import ScriptedModel, assistant_message
from cas_checkpoint.integrations.openai_agents import CasSession
async def main():
    s = CasSession("s1", {url!r})
    before = len(await s.get_items())
    model = ScriptedModel([[assistant_message("again")]])
    r = await Runner.run(Agent(name="calc", model=model), "once more", session=s)
    seen = len(model.calls[0].input)
    print(json.dumps([before, len(await s.get_items()), r.final_output, seen]))
asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120, check=True)
    before, after, said, seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert (before, after, said, seen) == (8, 10, "again", 9)  # the model saw the history


def objects_bytes(url: str) -> int:
    """Bytes of a local store's files outside refs/ (its objects and packs), once gc has
    dropped what nothing names (a save may merge packs, leaving the parts until gc)."""
    CheckpointStore.open(url).gc(grace=timedelta(0), repack=True)
    return present_bytes(p for p in Path(url).rglob("*")
                         if p.is_file() and p.relative_to(url).parts[0] != "refs")



def test_branch_from_turn_shares_items_and_fork_writes_only_refs(tmp_path: Path) -> None:
    url = str(tmp_path / "store")

    async def main() -> None:
        s = CasSession("main", url)
        await converse(s)
        for i in range(60):  # ~60 KB more after the branch point
            await s.add_items([{"role": "user", "content": f"note {i} " + "x" * 1000}])
        files = {p for p in Path(url).rglob("*") if p.is_file()}
        fork = await s.fork("copy")
        added = {p for p in Path(url).rglob("*") if p.is_file()} - files
        assert added and all(p.relative_to(url).parts[0] == "refs" for p in added), added
        assert await fork.get_items() == await s.get_items()
        before = objects_bytes(url)
        branch = await s.branch_from_turn(2, "what-if")
        items = await branch.get_items()
        assert [i.get("content") for i in items if i.get("role") == "user"] == ["hi"]
        assert len(items) == 2
        # a ref and (at most) one truncated list: no item is copied
        assert objects_bytes(url) - before < 4_000
        agent = Agent(name="calc", model=ScriptedModel([[assistant_message("other")]]))
        r = await Runner.run(agent, "something else", session=branch)
        assert r.final_output == "other"
        assert len(await s.get_items()) == 68  # the main session is untouched

    asyncio.run(main())


def test_one_more_turn_costs_about_one_turn(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    item = {"role": "user", "content": " ".join(f"w{j}" for j in range(200))}

    async def main() -> list[int]:
        s = CasSession("s", url)
        store = CheckpointStore.open(url)
        grown = []
        for i in range(120):
            before = store.storage_bytes()
            await s.add_items([dict(item, content=f"{i} {item['content']}")])
            grown.append(store.storage_bytes() - before)
        return grown

    grown = asyncio.run(main())
    one = len(json.dumps(item))
    late = sorted(grown[100:])
    assert late[len(late) // 2] < 3 * one, (late, one)  # not the whole session (120 items)
    assert max(grown[100:]) < 30 * one


def test_two_writers_lose_no_item(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    CheckpointStore.open(url)

    def writer(name: str) -> None:
        s = CasSession("shared", CheckpointStore.open(url))  # a store object each: two writers

        async def go() -> None:
            for i in range(15):
                await s.add_items([{"role": "user", "content": f"{name}{i}"}])

        asyncio.run(go())

    threads = [threading.Thread(target=writer, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    async def check() -> list[Any]:
        return await CasSession("shared", url).get_items()

    items = asyncio.run(check())
    got = [i["content"] for i in items]
    assert sorted(got) == sorted(f"{n}{i}" for n in "ab" for i in range(15))
    assert [g for g in got if g[0] == "a"] == [f"a{i}" for i in range(15)]  # each in order


def test_pop_clear_limit(tmp_path: Path) -> None:
    async def main() -> None:
        s = CasSession("s", str(tmp_path / "store"), session_settings={"limit": 2})
        assert await s.pop_item() is None
        await s.add_items([{"role": "user", "content": str(i)} for i in range(5)])
        assert [i["content"] for i in await s.get_items()] == ["3", "4"]
        assert len(await s.get_items(limit=10)) == 5
        assert (await s.pop_item()) == {"role": "user", "content": "4"}
        await s.clear_session()
        assert await s.get_items() == []
        s.close()
        with pytest.raises(RuntimeError, match="closed"):
            await s.get_items()

    asyncio.run(main())


def test_s3_on_moto(moto_server: dict[str, Any]) -> None:
    url = f"s3://{moto_server['bucket']}/agents-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        s = CasSession("s1", url, storage_options=moto_server["storage_options"])
        assert await converse(s) == ["hello", "it is 5", "bye"]
        await s.fork("s2")
        other = CasSession("s2", url, storage_options=moto_server["storage_options"])
        assert await other.get_items() == await s.get_items()

    asyncio.run(main())


@pytest.mark.parametrize("raw", [[1], {"items": "x"}, {"items": [1, {"role": "user"}]},
                                 {"nothing": 1}])
def test_hostile_stored_session_raises_format_error(tmp_path: Path, raw: Any) -> None:
    url = str(tmp_path / "store")
    CheckpointStore.open(url).save("agents/session/s", raw)

    async def main() -> None:
        s = CasSession("s", url)
        for call in (s.get_items, s.pop_item):
            with pytest.raises(FormatError, match="not one this adapter wrote") as e:
                await call()
            assert isinstance(e.value, CasError)

    asyncio.run(main())


def test_agents_sdk_own_session_tests() -> None:
    """The SDK's tests/memory/test_session.py (a subset: its direct session tests and the
    runner's three methods on one of them) on CasSession beside SQLiteSession
    (compat/agents_suite.py; from the installed version's sdist)."""
    got = subprocess.run(
        [sys.executable, str(ROOT / "compat" / "agents_suite.py"), "-k",
         "direct or pop or limit or unicode or special or concurrent or settings or "
         "basic_functionality or different_sessions"],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if got.returncode == 2:
        pytest.skip(f"the SDK's tests could not be fetched: {got.stdout.strip()[-300:]}")
    assert got.returncode == 0, got.stdout + got.stderr
    rows = {line.split("|")[1].strip(): line.split("|") for line in got.stdout.splitlines()
            if line.startswith("| ") and "backend" not in line}
    assert int(rows["CAS_LOCAL"][2]) == int(rows["CAS_MEMORY"][2]) >= 15, got.stdout
    assert int(rows["CAS_LOCAL"][3]) == int(rows["CAS_MEMORY"][3]) == 0, got.stdout
