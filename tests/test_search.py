"""store.search: the same matches as a plain-Python scan of the loaded states, each distinct
node read once however many forks share it, validated queries, limits, every backend."""

from __future__ import annotations

import dataclasses
import enum
import json
import random
import re
from typing import Annotated, Any, TypedDict

import pytest
from conftest import open_store
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.graph.message import add_messages

from cas_checkpoint import CheckpointStore, InvalidArgumentError
from cas_checkpoint.query.search import MAX_PATTERN
from cas_checkpoint.tree import build as tree


def _key(k: Any) -> str:
    return f"[{json.dumps(k, ensure_ascii=False)}]" if type(k) is str else f"[{k!r}]"


def scan(value: Any, pattern: re.Pattern[str], path: str = "") -> list[tuple[str, str]]:
    """Plain-Python search of a loaded state: (path, matched text) in document order."""
    if type(value) is str:
        m = pattern.search(value)
        return [] if m is None else [(path, m.group())]
    out: list[tuple[str, str]] = []
    if type(value) is dict:
        for k, v in value.items():
            out += scan(v, pattern, path + _key(k))
    elif type(value) in (list, tuple):
        for i, v in enumerate(value):
            out += scan(v, pattern, f"{path}[{i}]")
    return out


words = st.sampled_from(["alpha", "Beta", "gamma", "NEEDLE", "needle", "x" * 50, "δelta"])
texts = st.lists(words, max_size=5).map(" ".join)
values = st.recursive(st.one_of(texts, st.integers(), st.none(), st.binary(max_size=3)),
                      lambda inner: st.one_of(
                          st.lists(inner, max_size=5),
                          st.dictionaries(st.sampled_from(["a", "needle", "k"]), inner,
                                          max_size=3),
                          st.lists(inner, max_size=3).map(tuple)), max_leaves=20)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(values, st.sampled_from([0, 50, 5000]), st.integers(0, 2**32),
       st.sampled_from([("needle", False), ("gamma ne", False), (r"[Bb]eta\b", True)]))
def test_search_matches_plain_python_scan(extra: Any, size: int, seed: int,
                                          query: tuple[str, bool]) -> None:
    rng = random.Random(seed)
    msgs = [{"role": "user", "content": " ".join(rng.choice(["needle", "hay", "stack", "Beta"])
                                                for _ in range(rng.randrange(1, 30)))}
            for _ in range(size)]
    long_text = "hay " * 12_000 + "NeEdLe" + " stack" * 100  # split into chunks
    state = {"messages": msgs, "extra": extra, "long": long_text, "n": [extra, (1, "needle")]}
    store = CheckpointStore.open(f"memory://search-{rng.getrandbits(64):x}")
    info = store.save("t", state)
    fresh = CheckpointStore.open(store.url)
    loaded = fresh.load("t").state
    text, regex = query
    pattern = re.compile(text) if regex else re.compile(re.escape(text), re.IGNORECASE)
    got = fresh.search(text, regex=regex)
    assert [(m.path, m.thread_id, m.checkpoint_id) for m in got.matches] == [
        (p, "t", info.id) for p, _ in scan(loaded, pattern)]
    for m, (_, found) in zip(got.matches, scan(loaded, pattern), strict=True):
        assert found in m.snippet and "\n" not in m.snippet and len(m.snippet) <= len(found) + 82
    assert got.checkpoints_searched == 1 and not got.truncated


def test_forks_share_their_reads() -> None:
    """1,000 threads forked from one 200-message conversation, each adding a message: the
    search reads about one conversation plus the 1,000 new parts."""
    rng = random.Random(7)
    msgs = [{"role": "user", "content": f"message {i} " + "".join(
        rng.choice("abcdefgh ") for _ in range(380))} for i in range(200)]
    msgs[120]["content"] += " the Secret Phrase"
    store = CheckpointStore.open(f"memory://search-forks-{rng.getrandbits(64):x}")
    base = store.save("base", {"messages": msgs})
    one = len(tree.build({"messages": msgs}).objects)
    for i in range(1000):
        store.fork("base", base.id, f"f{i:04d}")
        store.save(f"f{i:04d}", {"messages": msgs + [
            {"role": "ai", "content": f"reply {i}" + (" secret phrase" if i % 10 == 0 else "")}]})
    fresh = CheckpointStore.open(store.url)
    calls: list[tuple[int, int]] = []
    got = fresh.search("SECRET phrase", progress=lambda d, t: calls.append((d, t)))
    assert got.checkpoints_searched == 1001 and calls[-1] == (1001, 1001) and len(calls) == 1001
    expected = [("base", '["messages"][120]["content"]')]
    for i in range(1000):
        expected.append((f"f{i:04d}", '["messages"][120]["content"]'))
        if i % 10 == 0:
            expected.append((f"f{i:04d}", '["messages"][200]["content"]'))
    assert [(m.thread_id, m.path) for m in got.matches] == expected
    # each distinct node once: one conversation, plus a few new nodes per fork
    assert got.nodes_read <= one + 1000 * 4
    # each head read on its own: 1001 x the nodes. (The 200 messages are ~20 nodes, 16 KB
    # regions and the open region's leaves, so the reads are ~one + 2.5 a fork: 8x fewer;
    # with one leaf a message, as before November 2026, ~270 nodes: 50x fewer.)
    assert got.nodes_read * 5 < 1001 * one, (got.nodes_read, one)
    # with a limit it stops early, and says so
    few = fresh.search("secret phrase", limit=3)
    assert len(few.matches) == 3 and few.truncated and few.checkpoints_searched <= 3
    # all_history: the base checkpoint, which every fork holds, is searched once
    hist = fresh.search("secret phrase", all_history=True)
    assert hist.checkpoints_searched == 1001
    assert len({m.checkpoint_id for m in hist.matches}) == 1001


def test_one_thread_and_history() -> None:
    store = CheckpointStore.open("memory://search-history")
    store.save("t", {"m": ["old needle"]})
    store.save("t", {"m": ["new"]})
    store.save("u", {"m": ["needle in u"]})
    assert [m.thread_id for m in store.search("needle").matches] == ["u"]
    assert store.search("needle", thread_id="t").matches == []
    hist = store.search("needle", thread_id="t", all_history=True)
    assert [m.snippet for m in hist.matches] == ["old needle"]
    assert hist.checkpoints_searched == 2


def test_queries_are_validated() -> None:
    store = CheckpointStore.open("memory://search-args")
    store.save("t", {"a": "text"})
    for bad, regex in [("", False), ("x" * (MAX_PATTERN + 1), False), ("(", True),
                       ("a*", True), (3, False)]:
        with pytest.raises(InvalidArgumentError):
            store.search(bad, regex=regex)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        store.search("a", limit=0)
    assert store.search("(", regex=False).matches == []
    assert [m.path for m in store.search("TEX").matches] == ['["a"]']
    assert store.search("TEX", regex=True).matches == []


@pytest.mark.parametrize("backend_kind", ["memory", "local", "s3", "memory-async"])
def test_search_on_every_backend(backend_kind: str, tmp_path: Any,
                                 request: pytest.FixtureRequest) -> None:
    store = open_store(backend_kind, tmp_path, request)
    a = store.save("t", {"messages": [{"content": f"m{i} " + "x" * 300} for i in range(100)]})
    store.fork("t", a.id, "u")
    store.save("u", {"messages": [{"content": "m7 and the Answer"}]})
    got = store.search("answer")
    assert [(m.thread_id, m.path) for m in got.matches] == [("u", '["messages"][0]["content"]')]
    assert got.nodes_read >= 1 and got.bytes_read > 0 and got.checkpoints_searched == 2


# --- registered objects: searched in their stored data, never built ------------------------------

BUILT: list[str] = []


@dataclasses.dataclass
class Note:
    title: str
    tags: list[str]
    inner: Any = None

    def __post_init__(self) -> None:
        BUILT.append(self.title)


class Mood(enum.Enum):
    CALM = "calm needle"
    LOUD = "loud"


def test_registered_objects_are_searched_without_being_built() -> None:
    import pydantic

    class Card(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="allow")
        text: str

    types = [Note, Mood, Card]
    store = CheckpointStore.open(f"memory://search-objects-{random.getrandbits(64):x}",
                                 types=types)
    card = Card(text="a Needle in a card", **{"my field": "needle extra"})
    state = {"notes": [Note("first", ["hay"]), Note("needle title", ["x", "NEEDLE tag"],
                                                    inner=Note("deep", ["needle deep"]))],
             "mood": Mood.CALM, "cards": (card, {"k": [card]}), "plain": "needle"}
    info = store.save("t", state)
    BUILT.clear()
    expected = ['["notes"][1].title', '["notes"][1].tags[1]', '["notes"][1].inner.tags[0]',
                '["mood"].value', '["cards"][0].text', '["cards"][0]."my field"',
                '["cards"][1]["k"][0].text', '["cards"][1]["k"][0]."my field"', '["plain"]']
    for url_types in (types, []):  # whether this store object knows the classes or not
        fresh = CheckpointStore.open(store.url, types=url_types)
        got = fresh.search("needle")
        assert [m.path for m in got.matches] == expected
        assert all(m.checkpoint_id == info.id for m in got.matches)
        assert "NEEDLE tag" in got.matches[1].snippet
    assert BUILT == []  # no Note was constructed by the searches
    assert CheckpointStore.open(store.url, types=types).load("t").state == state


class LgState(TypedDict):
    messages: Annotated[list[Any], add_messages]


def test_langchain_messages_in_a_langgraph_store_are_found() -> None:
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.graph import END, START, StateGraph

    from cas_checkpoint.integrations.langgraph import CasSaver

    def bot(state: LgState) -> dict[str, Any]:
        return {"messages": [AIMessage(content="our refund policy is 30 days")]}

    builder = StateGraph(LgState)
    builder.add_node("bot", bot)
    builder.add_edge(START, "bot")
    builder.add_edge("bot", END)
    url = f"memory://search-lg-{random.getrandbits(64):x}"
    graph = builder.compile(checkpointer=CasSaver(CheckpointStore.open(url)))
    graph.invoke({"messages": [HumanMessage(content="hi")]},
                 {"configurable": {"thread_id": "t1"}})
    # all history: the thread's head is sometimes a pending write that LangGraph's background
    # writer saved after the last checkpoint
    got = CheckpointStore.open(url).search("REFUND POLICY", all_history=True)
    found = [m for m in got.matches if m.path == '["channel_values"]["messages"][1].content']
    assert found and "our refund policy" in found[0].snippet
    assert found[0].thread_id.startswith("lg:")
    hist = CheckpointStore.open(url).search("hi", regex=True, all_history=True)
    assert '["channel_values"]["messages"][0].content' in {m.path for m in hist.matches}
