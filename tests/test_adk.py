"""Google ADK sessions on the store (cas_checkpoint.integrations.adk): ADK's own runner with a
scripted model, resume in a new process, O(1) fork, sharing between consecutive events,
StaleSessionError under two writers, S3 on moto, hostile stored data, and ADK's own
session-service tests (compat/adk_suite.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk", reason="needs the adk extra: pip install -e '.[adk]'")

from builders import present_bytes  # noqa: E402
from google.adk.agents import LlmAgent  # noqa: E402
from google.adk.errors import StaleSessionError  # noqa: E402
from google.adk.events import Event, EventActions  # noqa: E402
from google.adk.models.base_llm import BaseLlm  # noqa: E402
from google.adk.models.llm_request import LlmRequest  # noqa: E402
from google.adk.models.llm_response import LlmResponse  # noqa: E402
from google.adk.runners import Runner  # noqa: E402
from google.adk.sessions import InMemorySessionService  # noqa: E402
from google.genai import types  # noqa: E402

from cas_checkpoint import CasError, CheckpointStore, FormatError  # noqa: E402
from cas_checkpoint.aio import AsyncCheckpointStore  # noqa: E402
from cas_checkpoint.integrations.adk import (  # noqa: E402
    CasArtifactService,
    CasSessionService,
)

ROOT = Path(__file__).resolve().parent.parent
APP, USER = "app", "u1"


class ScriptedLlm(BaseLlm):
    """A model with no network: "add A B" calls the add tool, a tool's result is reported,
    anything else is echoed."""

    async def generate_content_async(self, llm_request: LlmRequest, stream: bool = False
                                     ) -> AsyncGenerator[LlmResponse, None]:
        last = llm_request.contents[-1]
        part = last.parts[0] if last.parts else None
        if part is not None and part.function_response is not None:
            text = f"the sum is {part.function_response.response['result']}"
            yield LlmResponse(content=types.Content(role="model",
                                                    parts=[types.Part(text=text)]))
            return
        said = (part.text or "") if part is not None else ""
        if said.startswith("add "):
            a, b = (int(x) for x in said.split()[1:3])
            call = types.FunctionCall(name="add", args={"a": a, "b": b})
            yield LlmResponse(content=types.Content(role="model",
                                                    parts=[types.Part(function_call=call)]))
            return
        yield LlmResponse(content=types.Content(role="model",
                                                parts=[types.Part(text=f"echo: {said}")]))


def add(a: int, b: int) -> dict[str, int]:
    """Add two numbers."""
    return {"result": a + b}


def agent() -> LlmAgent:
    return LlmAgent(name="calc", model=ScriptedLlm(model="scripted"), tools=[add],
                    instruction="add numbers")


async def say(runner: Runner, session_id: str, text: str) -> list[str]:
    out = []
    msg = types.Content(role="user", parts=[types.Part(text=text)])
    async for ev in runner.run_async(user_id=USER, session_id=session_id, new_message=msg):
        for p in (ev.content.parts or []) if ev.content else []:
            if p.text:
                out.append(p.text)
            if p.function_call:
                out.append(f"call {p.function_call.name}")
    return out


def shape(events: list[Event]) -> list[tuple[str, str]]:
    """What a conversation is, without ids and timestamps."""
    out = []
    for e in events:
        for p in (e.content.parts or []) if e.content else []:
            kind = ("text" if p.text else "call" if p.function_call
                    else "response" if p.function_response else "other")
            out.append((e.author, f"{kind}:{p.text or ''}"))
    return out


TURNS = ["hello", "add 2 3", "add 10 20", "bye"]


async def conversation(service: Any, session_id: str) -> list[str]:
    runner = Runner(agent=agent(), app_name=APP, session_service=service)
    await service.create_session(app_name=APP, user_id=USER, session_id=session_id)
    said = []
    for t in TURNS:
        said += await say(runner, session_id, t)
    return said


def test_runner_conversation_equals_in_memory_and_resumes_in_a_new_process(
        tmp_path: Path) -> None:
    url = str(tmp_path / "store")

    async def main() -> tuple[list[str], list[str], Any, Any]:
        ours = CasSessionService(url)
        theirs = InMemorySessionService()
        a = await conversation(ours, "s1")
        b = await conversation(theirs, "s1")
        sa = await ours.get_session(app_name=APP, user_id=USER, session_id="s1")
        sb = await theirs.get_session(app_name=APP, user_id=USER, session_id="s1")
        await ours.close()
        return a, b, sa, sb

    a, b, sa, sb = asyncio.run(main())
    assert a == b and "the sum is 30" in a
    assert shape(sa.events) == shape(sb.events) and len(sa.events) == len(sb.events)
    code = f"""
import asyncio, json, sys
sys.path.insert(0, {str(ROOT / 'tests')!r})
from test_adk import CasSessionService, Runner, agent, say, APP, USER, shape
async def main():
    s = CasSessionService({url!r})
    got = await s.get_session(app_name=APP, user_id=USER, session_id="s1")
    before = len(got.events)
    said = await say(Runner(agent=agent(), app_name=APP, session_service=s), "s1", "add 1 1")
    got = await s.get_session(app_name=APP, user_id=USER, session_id="s1")
    print(json.dumps([before, len(got.events), said]))
asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120, check=True)
    before, after, said = json.loads(out.stdout.strip().splitlines()[-1])
    assert before == len(sa.events) and after == before + 4
    assert said == ["call add", "the sum is 2"]


def test_fork_writes_no_event_and_branches_diverge(tmp_path: Path) -> None:
    url = str(tmp_path / "store")

    async def main() -> None:
        service = CasSessionService(url)
        await conversation(service, "s1")
        s1 = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
        for i in range(100):  # ~100 KB of events after the fork point
            await service.append_event(s1, text_event(i))
        files = {p for p in Path(url).rglob("*") if p.is_file()}
        size = present_bytes(files)
        cut = s1.events[3].id
        fork = await service.fork_session(app_name=APP, user_id=USER, session_id="s1",
                                          new_session_id="s2", at_event_id=cut)
        added = {p for p in Path(url).rglob("*") if p.is_file()} - files
        grown = present_bytes({p for p in Path(url).rglob("*") if p.is_file()}) - size
        # a fork writes a ref (its head: ids, no events), no object: no event is copied
        assert added and all(p.relative_to(url).parts[0] == "refs" for p in added), added
        assert grown < 20_000, grown
        assert [e.id for e in fork.events] == [e.id for e in s1.events[:4]]
        runner = Runner(agent=agent(), app_name=APP, session_service=service)
        assert await say(runner, "s2", "add 4 4") == ["call add", "the sum is 8"]
        again = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
        assert len(again.events) == len(s1.events) == 112  # the original is untouched
        back = await service.rewind_session(app_name=APP, user_id=USER, session_id="s1",
                                            to_event_id=cut)
        assert len(back.events) == 4
        await service.close()

    asyncio.run(main())


def text_event(i: int, size: int = 1_000) -> Event:
    words = " ".join(f"w{i}-{j}" for j in range(size // 8))
    return Event(author="user", invocation_id=f"inv{i}",
                 content=types.Content(role="user", parts=[types.Part(text=words)]))


def test_one_more_event_costs_about_one_event(tmp_path: Path) -> None:
    url = str(tmp_path / "store")

    async def main() -> list[int]:
        service = CasSessionService(url)
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        store = CheckpointStore.open(url)
        grown = []
        for i in range(120):
            before = store.storage_bytes()
            await service.append_event(session, text_event(i))
            grown.append(store.storage_bytes() - before)
        await service.close()
        return grown

    grown = asyncio.run(main())
    event_bytes = len(text_event(0).model_dump_json(exclude_none=True))
    late = sorted(grown[100:])
    # the 101st..120th events each add about one event (compressed), not the whole session
    # (120 KB); a median under 3 events' bytes leaves room for the record and log entry
    assert late[len(late) // 2] < 3 * event_bytes, (late, event_bytes)
    assert max(grown[100:]) < 30 * event_bytes  # an occasional region seal, never a copy


def test_two_writers_get_stale_session_error(tmp_path: Path) -> None:
    url = str(tmp_path / "store")

    async def main() -> None:
        a, b = CasSessionService(url), CasSessionService(url)
        await a.create_session(app_name=APP, user_id=USER, session_id="s")
        sa = await a.get_session(app_name=APP, user_id=USER, session_id="s")
        sb = await b.get_session(app_name=APP, user_id=USER, session_id="s")
        await a.append_event(sa, text_event(1, 50))
        with pytest.raises(StaleSessionError, match="get_session"):
            await b.append_event(sb, text_event(2, 50))
        # a race inside append_event: another writer saves between its read and its save
        fresh = await b.get_session(app_name=APP, user_id=USER, session_id="s")
        store = await b._lazy.get()
        real = store.save

        async def racing(thread_id: str, state: Any, **kw: Any) -> Any:
            other = await a.get_session(app_name=APP, user_id=USER, session_id="s")
            await a.append_event(other, text_event(3, 50))
            return await real(thread_id, state, **kw)

        store.save = racing  # type: ignore[method-assign]
        with pytest.raises(StaleSessionError, match="same time"):
            await b.append_event(fresh, text_event(4, 50))
        store.save = real  # type: ignore[method-assign]
        got = await a.get_session(app_name=APP, user_id=USER, session_id="s")
        assert [e.invocation_id for e in got.events] == ["inv1", "inv3"]
        await a.close()
        await b.close()

    asyncio.run(main())


def test_shared_user_and_app_state_across_sessions(tmp_path: Path) -> None:
    async def main() -> None:
        service = CasSessionService(str(tmp_path / "store"))
        s1 = await service.create_session(app_name=APP, user_id=USER, session_id="one/two")
        await service.create_session(app_name=APP, user_id=USER, session_id="b")
        ev = Event(author="user", invocation_id="i",
                   actions=EventActions(state_delta={"user:lang": "fr", "app:v": 2,
                                                     "temp:t": 1, "k": "v"}))
        await service.append_event(s1, ev)
        b = await service.get_session(app_name=APP, user_id=USER, session_id="b")
        assert b.state == {"user:lang": "fr", "app:v": 2}
        assert await service.get_user_state(app_name=APP, user_id=USER) == {"lang": "fr"}
        listed = await service.list_sessions(app_name=APP, user_id=USER)
        assert [s.id for s in listed.sessions] == ["b", "one/two"]  # oldest update first
        await service.delete_session(app_name=APP, user_id=USER, session_id="one/two")
        assert await service.get_session(app_name=APP, user_id=USER,
                                         session_id="one/two") is None
        await service.close()

    asyncio.run(main())


def test_s3_on_moto(moto_server: dict[str, Any]) -> None:
    url = f"s3://{moto_server['bucket']}/adk-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        service = CasSessionService(url, storage_options=moto_server["storage_options"])
        said = await conversation(service, "s1")
        assert "the sum is 30" in said
        got = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
        await service.fork_session(app_name=APP, user_id=USER, session_id="s1",
                                   new_session_id="s2")
        again = CasSessionService(url, storage_options=moto_server["storage_options"])
        fork = await again.get_session(app_name=APP, user_id=USER, session_id="s2")
        assert shape(fork.events) == shape(got.events)
        await service.close()
        await again.close()

    asyncio.run(main())


HOSTILE = [
    ["not", "a", "session"],
    {"state": {}, "events": "x", "last_update_time": 1.0},
    {"state": {}, "events": [], "last_update_time": "now"},
    {"state": {}, "events": [{"author": {"nested": 1}, "invocation_id": 3}],
     "last_update_time": 1.0},
    {"state": {}, "events": [7], "last_update_time": 1.0},
    {"state": {}, "events": [{"content": {"parts": [{"inline_data": {"data": "%%%"}}]}}],
     "last_update_time": 1.0},
]


@pytest.mark.parametrize("raw", HOSTILE)
def test_hostile_stored_sessions_raise_format_error(tmp_path: Path, raw: Any) -> None:
    url = str(tmp_path / "store")

    async def main() -> None:
        service = CasSessionService(url)
        s = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        store = await AsyncCheckpointStore.open(url)
        await store.save("adk/session/app/u1/s", raw)
        with pytest.raises(FormatError, match="not one this adapter wrote") as e:
            await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert isinstance(e.value, CasError)
        with pytest.raises((FormatError, StaleSessionError)):  # (the head moved, too)
            await service.append_event(s, text_event(0, 10))
        await store.aclose()
        await service.close()

    asyncio.run(main())


def test_adk_own_session_service_tests() -> None:
    """ADK's tests/unittests/sessions/test_session_service.py on our service, beside ADK's
    in-memory and SQLite services (compat/adk_suite.py; the tests come from ADK's repository:
    $CAS_ADK_REPO, else the installed version's tag on GitHub)."""
    got = subprocess.run([sys.executable, str(ROOT / "compat" / "adk_suite.py")],
                         capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if got.returncode == 2:
        pytest.skip(f"ADK's tests could not be fetched: {got.stdout.strip()[-300:]}")
    assert got.returncode == 0, got.stdout + got.stderr
    rows = {line.split("|")[1].strip(): line for line in got.stdout.splitlines()
            if line.startswith("| ") and "backend" not in line}
    passed = {b: int(rows[b].split("|")[2]) for b in rows}
    assert passed["CAS_MEMORY"] == passed["CAS_LOCAL"] == passed["IN_MEMORY"] >= 6, got.stdout


def blob(data: bytes) -> types.Part:
    return types.Part.from_bytes(data=data, mime_type="application/octet-stream")


def test_artifacts_are_content_addressed_chunked_and_numbered(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    big = os.urandom(1 << 20)

    async def main() -> None:
        arts = CasArtifactService(url)
        store = CheckpointStore.open(url)
        kw: dict[str, Any] = {"app_name": APP, "user_id": USER, "session_id": "s"}
        assert await arts.save_artifact(filename="f.bin", artifact=blob(big), **kw) == 0
        one = store.storage_bytes()
        assert one > len(big)  # random bytes do not compress
        # the same bytes again as a new version: no chunk is added (the store writes packs
        # per thread, so another artifact with these bytes would store them once more)
        assert await arts.save_artifact(filename="f.bin", artifact=blob(big), **kw) == 1
        assert store.storage_bytes() - one < 8_000
        assert await arts.save_artifact(filename="g.bin", artifact=blob(b"g"), **kw) == 0
        # one byte changed in the middle: a few chunks (FastCDC), not the file again
        two = store.storage_bytes()
        changed = big[:500_000] + b"x" + big[500_001:]
        assert await arts.save_artifact(filename="f.bin", artifact=blob(changed), **kw,
                                        custom_metadata={"why": "edit"}) == 2
        assert store.storage_bytes() - two < len(big) // 8
        assert await arts.list_versions(filename="f.bin", **kw) == [0, 1, 2]
        versions = await arts.list_artifact_versions(filename="f.bin", **kw)
        assert [v.version for v in versions] == [0, 1, 2]
        assert versions[2].custom_metadata == {"why": "edit"}
        assert versions[0].mime_type == "application/octet-stream"
        got = await arts.load_artifact(filename="f.bin", version=0, **kw)
        assert got is not None and got.inline_data is not None and got.inline_data.data == big
        latest = await arts.load_artifact(filename="f.bin", **kw)
        assert latest is not None and latest.inline_data is not None
        assert latest.inline_data.data == changed
        assert await arts.load_artifact(filename="f.bin", version=3, **kw) is None
        await arts.save_artifact(app_name=APP, user_id=USER, filename="user:prefs",
                                 artifact=types.Part(text="dark mode"))
        assert await arts.list_artifact_keys(**kw) == ["f.bin", "g.bin", "user:prefs"]
        await arts.delete_artifact(filename="g.bin", **kw)
        assert await arts.load_artifact(filename="g.bin", **kw) is None
        await arts.close()

    asyncio.run(main())


def test_artifacts_on_s3_moto(moto_server: dict[str, Any]) -> None:
    url = f"s3://{moto_server['bucket']}/adk-art-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        arts = CasArtifactService(url, storage_options=moto_server["storage_options"])
        kw: dict[str, Any] = {"app_name": APP, "user_id": USER, "session_id": "s"}
        data = os.urandom(300_000)
        for i in range(3):
            assert await arts.save_artifact(filename="r.bin", artifact=blob(data + bytes([i])),
                                            **kw) == i
        got = await arts.load_artifact(filename="r.bin", version=1, **kw)
        assert got is not None and got.inline_data is not None
        assert got.inline_data.data == data + b"\x01"
        await arts.close()

    asyncio.run(main())


def test_hostile_stored_artifact_raises_format_error(tmp_path: Path) -> None:
    url = str(tmp_path / "store")

    async def main() -> None:
        arts = CasArtifactService(url)
        store = await AsyncCheckpointStore.open(url)
        name = "adk/artifact/app/u1/s/f"
        for raw in ({"part": {"inline_data": {"data": 5}}},
                    {"part": {}, "bytes": "not bytes"}, [1, 2]):
            await store.save(name, raw, metadata={"adk_artifact": {"version": 0,
                                                                   "canonical_uri": "x"}})
            with pytest.raises(FormatError, match="not one this adapter wrote"):
                await arts.load_artifact(app_name=APP, user_id=USER, session_id="s",
                                         filename="f")
            await store.delete_thread(name)
        await store.save(name, {"part": {"text": "t"}}, metadata={"adk_artifact": "x"})
        with pytest.raises(FormatError):
            await arts.list_artifact_versions(app_name=APP, user_id=USER, session_id="s",
                                              filename="f")
        await store.aclose()
        await arts.close()

    asyncio.run(main())
