"""Pydantic AI conversations on the store (cas_checkpoint.integrations.pydantic_ai).

Pydantic AI's repository has no tests for its conversation-store backends, so the first part is
a contract suite written from ``ConversationStore``'s documented semantics, run on Pydantic AI's
own ``InMemoryConversationStore`` and on ours (memory://, a local folder): both must pass it.
Then our own: an agent with a scripted ``FunctionModel`` and a tool equals a run on the
in-memory store, resumes in a new process and branches; ``read_history`` is one store read;
one more turn costs about one turn; a fork writes no message; two writers get
``ConversationConflict``; S3 on moto; hostile stored data gives ``FormatError``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="needs the pydantic-ai extra: "
                    "pip install -e '.[pydantic-ai]'")

from builders import present_bytes  # noqa: E402
from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.conversation import Conversation  # noqa: E402
from pydantic_ai.conversation_store import (  # noqa: E402
    ConversationConflict,
    ConversationStore,
    InMemoryConversationStore,
)
from pydantic_ai.exceptions import UserError  # noqa: E402
from pydantic_ai.messages import (  # noqa: E402
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel  # noqa: E402

from cas_checkpoint import CasError, CheckpointStore, FormatError  # noqa: E402
from cas_checkpoint.integrations.pydantic_ai import CasConversationStore  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture(params=["in-memory", "cas-memory", "cas-local"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ConversationStore:
    if request.param == "in-memory":
        return InMemoryConversationStore()
    if request.param == "cas-memory":
        return CasConversationStore(f"memory://pai-{uuid.uuid4().hex}")
    return CasConversationStore(str(tmp_path / "store"))


def req(text: str) -> ModelRequest:
    return ModelRequest(parts=[UserPromptPart(content=text)])


def resp(text: str) -> ModelResponse:
    return ModelResponse(parts=[TextPart(content=text)])


def turns(n: int, tag: str = "") -> list[ModelMessage]:
    out: list[ModelMessage] = []
    for i in range(n):
        out += [req(f"q{tag}{i}"), resp(f"a{tag}{i}")]
    return out


def texts(conv: Conversation | None) -> list[str]:
    assert conv is not None
    return [str(getattr(p, "content", "")) for m in conv.messages for p in m.parts]


# --- the contract (documented semantics of ConversationStore), on theirs and ours ---

def test_contract_load_save_and_append(store: ConversationStore) -> None:
    async def main() -> None:
        assert await store.load("c") is None
        conv = Conversation(conversation_id="c", messages=turns(2))
        entries = await store.save(conv)
        assert len(entries) == 4 and conv.revision is not None
        loaded = await store.load("c")
        assert loaded is not None and loaded.messages == conv.messages
        loaded.messages += turns(1, "x")
        more = await store.save(loaded)
        assert len(more) == 2  # only what the store did not have
        assert [e.id for e in await store.load_entries("c") or []] == \
            [e.id for e in entries + more]
        again = await store.load("c")
        assert texts(again)[-2:] == ["qx0", "ax0"]
        assert await store.save(again) == []  # nothing new
        window = await store.load("c", limit=3)
        assert window is not None and len(window.messages) == 3
        with pytest.raises(UserError):
            await store.load("c", limit=-1)

    run(main())


def test_contract_conflicts(store: ConversationStore) -> None:
    async def main() -> None:
        await store.save(Conversation(conversation_id="c", messages=turns(1)))
        a, b = await store.load("c"), await store.load("c")
        assert a is not None and b is not None
        a.messages += turns(1, "a")
        b.messages += turns(1, "b")
        await store.save(a)
        with pytest.raises(ConversationConflict):
            await store.save(b)
        with pytest.raises(ConversationConflict):  # an unloaded conversation with its id
            await store.save(Conversation(conversation_id="c", messages=turns(1)))
        with pytest.raises(ConversationConflict):
            await store.branch("c", at=0, expected_revision=b.revision)
        assert texts(await store.load("c"))[-1] == "aa0"

    run(main())


def test_contract_scope_and_listing(store: ConversationStore) -> None:
    async def main() -> None:
        await store.save(Conversation(conversation_id="x", messages=turns(1)), scope="ann")
        await store.save(Conversation(conversation_id="y", messages=turns(1)), scope="bob")
        await store.save(Conversation(conversation_id="z", messages=turns(1)), scope="ann")
        assert await store.load("x", scope="bob") is None
        assert await store.load("x", scope="ann") is not None
        x = await store.load("x")
        assert x is not None
        with pytest.raises(ConversationConflict):
            await store.save(x, scope="bob")
        ids = [r.conversation_id for r in await store.list_conversations(scope="ann")]
        assert ids == ["z", "x"]  # most recently saved first
        assert len(await store.list_conversations(limit=2)) == 2
        await store.delete("x", scope="bob")  # another scope: left as it is
        assert await store.load("x") is not None
        await store.delete("x")
        assert await store.load("x") is None
        assert [r.conversation_id for r in await store.list_conversations()] == ["z", "y"]

    run(main())


def test_contract_rewrite_branch_and_back(store: ConversationStore) -> None:
    async def main() -> None:
        await store.save(Conversation(conversation_id="c", messages=turns(3)))
        c = await store.load("c")
        assert c is not None
        old_tip = (await store.load_entries("c") or [])[-1].id
        branched = await store.branch("c", at=2, expected_revision=c.revision)
        assert len(branched.messages) == 2
        branched.messages += turns(1, "b")
        await store.save(branched)
        rec = await store.read_record("c")
        assert rec is not None and old_tip in rec.branches
        assert texts(await store.load("c")) == ["q0", "a0", "qb0", "ab0"]
        back = await store.branch("c", from_entry=old_tip, expected_revision=rec.revision)
        assert texts(back) == ["q0", "a0", "q1", "a1", "q2", "a2"]
        # a rewritten history (not loaded from the store) branches off what it shares
        rec = await store.read_record("c")
        assert rec is not None
        rewritten = Conversation(conversation_id="c", messages=turns(1) + turns(1, "r"),
                                 revision=rec.revision)
        await store.save(rewritten)
        assert texts(await store.load("c")) == ["q0", "a0", "qr0", "ar0"]
        with pytest.raises(UserError):
            await store.branch("c", at=99, expected_revision=rewritten.revision)

    run(main())


def test_contract_fork(store: ConversationStore) -> None:
    async def main() -> None:
        await store.save(Conversation(conversation_id="c", messages=turns(3)), scope="s")
        f = await store.fork("c", at=4, new_conversation_id="f")
        assert texts(f) == ["q0", "a0", "q1", "a1"]
        f.messages += turns(1, "f")
        await store.save(f)
        assert len((await store.load("c") or Conversation()).messages) == 6
        rec = await store.read_record("f")
        assert rec is not None and rec.forked_from == "c" and rec.scope == "s"
        with pytest.raises(ConversationConflict):
            await store.fork("c", new_conversation_id="f")
        whole = await store.fork("c", new_conversation_id="g")
        assert len(whole.messages) == 6
        await store.delete("c")  # the forks keep their histories
        assert texts(await store.load("f")) == ["q0", "a0", "q1", "a1", "qf0", "af0"]
        assert len((await store.load("g") or Conversation()).messages) == 6
        entries = await store.load_entries("f") or []
        assert (await store.read_entry(entries[1].id)).message == entries[1].message
        hist = await store.read_history(entries[-1].id, limit=2)
        assert [e.id for e in hist] == [e.id for e in entries[-2:]]

    run(main())


# --- ours: a real agent, a new process, costs, conflicts, S3, hostile data ---

def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    last = messages[-1].parts[-1]
    if isinstance(last, ToolReturnPart):
        return ModelResponse(parts=[TextPart(content=f"it is {last.content}")])
    said = str(getattr(last, "content", ""))
    if said.startswith("add"):
        a, b = (int(x) for x in said.split()[1:3])
        return ModelResponse(parts=[ToolCallPart(tool_name="add", args={"a": a, "b": b})])
    return ModelResponse(parts=[TextPart(content=f"echo {said} ({len(messages)} messages)")])


def make_agent() -> Agent[None, str]:
    agent = Agent(FunctionModel(scripted))

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    return agent


async def chat(store: ConversationStore, cid: str, prompts: list[str]) -> list[str]:
    agent, out = make_agent(), []
    for p in prompts:
        conv = await store.load(cid) or Conversation(conversation_id=cid)
        result = await agent.run(p, conversation=conv)
        await store.save(result)
        out.append(result.output)
    return out


PROMPTS = ["hello", "add 2 3", "add 10 20", "bye"]


def test_agent_equals_in_memory_resumes_in_a_new_process_and_branches(tmp_path: Path) -> None:
    url = str(tmp_path / "store")

    async def main() -> tuple[list[str], list[str], list[str], list[str]]:
        ours, theirs = CasConversationStore(url), InMemoryConversationStore()
        a, b = await chat(ours, "c", PROMPTS), await chat(theirs, "c", PROMPTS)
        return a, b, texts(await ours.load("c")), texts(await theirs.load("c"))

    a, b, ta, tb = run(main())
    assert a == b and a[2] == "it is 30"
    assert ta == tb
    code = f"""
import asyncio, json, sys
sys.path.insert(0, {str(ROOT / 'tests')!r})
from test_pydantic_ai import CasConversationStore, chat, texts
async def main():
    s = CasConversationStore({url!r})
    said = await chat(s, "c", ["add 1 1"])
    c = await s.load("c")
    b = await s.branch("c", at=2, expected_revision=c.revision)
    print(json.dumps([said, len(c.messages), texts(b)]))
asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120, check=True)
    said, n, branched = json.loads(out.stdout.strip().splitlines()[-1])
    assert said == ["it is 2"] and n == len(ta) + 4
    assert branched == ["hello", "echo hello (1 messages)"]


def counting(store: CheckpointStore) -> dict[str, int]:
    counts = {"load": 0, "save": 0}
    for name in counts:
        real = getattr(store, name)

        def wrapped(*a: Any, _real: Callable[..., Any] = real, _n: str = name,
                    **kw: Any) -> Any:
            counts[_n] += 1
            return _real(*a, **kw)

        setattr(store, name, wrapped)
    return counts


def test_a_load_is_one_store_read_and_a_turn_costs_a_turn(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    store = CheckpointStore.open(url)
    pai = CasConversationStore(store)
    body = " ".join(f"w{j}" for j in range(150))

    async def main() -> list[int]:
        await pai.save(Conversation(conversation_id="c", messages=[]))
        grown = []
        for i in range(60):
            c = await pai.load("c")
            assert c is not None
            c.messages += [req(f"{i} {body}"), resp(f"{i} {body}")]
            before = store.storage_bytes()
            await pai.save(c)
            grown.append(store.storage_bytes() - before)
        fresh = CasConversationStore(CheckpointStore.open(url))
        counts = counting(fresh.store)
        got = await fresh.load("c")
        assert got is not None and len(got.messages) == 120
        assert counts["load"] == 1  # the record and all 120 messages: one thread state
        return grown

    grown = run(main())
    one_turn = 2 * len(body)
    late = sorted(grown[40:])
    assert late[len(late) // 2] < 3 * one_turn, (late, one_turn)


def objects_bytes(url: str) -> int:
    """Bytes of a local store's objects and packs once gc has dropped what nothing names (a
    save may merge packs, leaving the parts behind until gc)."""
    CheckpointStore.open(url).gc(grace=timedelta(0), repack=True)
    return present_bytes(p for p in Path(url).rglob("*")
                         if p.is_file() and p.relative_to(url).parts[0] != "refs")



def test_fork_and_branch_copy_no_message(tmp_path: Path) -> None:
    """A conversation saved turn by turn (as agents do): a fork or a branch at any earlier
    message ends its entries list where an earlier save did, so its nodes are stored already."""
    url = str(tmp_path / "store")

    async def main() -> None:
        pai = CasConversationStore(url)
        await pai.save(Conversation(conversation_id="c", messages=[]))
        for _ in range(80):  # incompressible text, so that a copy would show
            c = await pai.load("c")
            assert c is not None
            c.messages += [req(os.urandom(500).hex()), resp(os.urandom(500).hex())]
            await pai.save(c)
        before = objects_bytes(url)
        await pai.fork("c", at=100, new_conversation_id="f")
        await pai.fork("c", new_conversation_id="g")
        c = await pai.load("c")
        assert c is not None
        await pai.branch("c", at=50, expected_revision=c.revision)
        # copies would add 100 + 160 + 50 messages (~190% of the conversation); the three
        # heads add records and index nodes (0-3 KB each in most runs), and a cut inside a
        # closed region of the list rewrites that region (up to ~57 KB of ~180 KB measured)
        grown = objects_bytes(url) - before
        assert grown < before // 2, (grown, before)
        assert len((await pai.load("f") or Conversation()).messages) == 100

    run(main())


def test_two_writers_conflict_across_store_objects(tmp_path: Path) -> None:
    url = str(tmp_path / "store")

    async def main() -> None:
        a = CasConversationStore(CheckpointStore.open(url))
        b = CasConversationStore(CheckpointStore.open(url))
        await a.save(Conversation(conversation_id="c", messages=turns(1)))
        ca, cb = await a.load("c"), await b.load("c")
        assert ca is not None and cb is not None
        ca.messages += turns(1, "a")
        cb.messages += turns(1, "b")
        await a.save(ca)
        with pytest.raises(ConversationConflict):
            await b.save(cb)
        # a race: another writer saves between b's read and b's compare-and-swap
        cb = await b.load("c")
        assert cb is not None
        cb.messages += turns(1, "b")
        real = b.store.save

        def racing(*args: Any, **kw: Any) -> Any:
            b.store.save = real  # type: ignore[method-assign]
            other = CasConversationStore(CheckpointStore.open(url))

            async def step() -> None:
                oc = await other.load("c")
                assert oc is not None
                oc.messages += turns(1, "o")
                await other.save(oc)

            asyncio.run(step())
            return real(*args, **kw)

        b.store.save = racing  # type: ignore[method-assign]
        with pytest.raises(ConversationConflict):
            await b.save(cb)
        assert texts(await a.load("c"))[-1] == "ao0"

    run(main())


def test_s3_on_moto(moto_server: dict[str, Any]) -> None:
    url = f"s3://{moto_server['bucket']}/pai-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        s = CasConversationStore(url, storage_options=moto_server["storage_options"])
        said = await chat(s, "c", PROMPTS)
        assert said[1] == "it is 5"
        f = await s.fork("c", at=2, new_conversation_id="f")
        again = CasConversationStore(CheckpointStore.open(
            url, storage_options=moto_server["storage_options"]))
        assert texts(await again.load("f")) == texts(f)

    run(main())


HOSTILE = [
    [1, 2],
    {"entries": "x"},
    {"entries": [{"no": "id"}]},
    {"record": {"conversation_id": 3}, "entries": []},
    {"record": None, "entries": []},
]


@pytest.mark.parametrize("raw", HOSTILE)
def test_hostile_stored_conversation_raises_format_error(tmp_path: Path, raw: Any) -> None:
    url = str(tmp_path / "store")
    CheckpointStore.open(url).save("pydantic-ai/conversation/c", raw)

    async def main() -> None:
        with pytest.raises(FormatError, match="not one this adapter wrote") as e:
            await CasConversationStore(url).load("c")
        assert isinstance(e.value, CasError)

    run(main())


def test_hostile_stored_message_raises_format_error(tmp_path: Path) -> None:
    url = str(tmp_path / "store")

    async def main() -> None:
        pai = CasConversationStore(url)
        await pai.save(Conversation(conversation_id="c", messages=turns(1)))
        store = CheckpointStore.open(url)
        state = store.load("pydantic-ai/conversation/c").state
        state["entries"][0]["message"] = {"kind": "request", "parts": [{"part_kind": "evil"}]}
        store.save("pydantic-ai/conversation/c", state)
        with pytest.raises(FormatError, match="not one this adapter wrote"):
            await CasConversationStore(url).load("c")

    run(main())
