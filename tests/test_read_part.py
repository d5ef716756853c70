"""``store.read_part``: one part of a state read without the rest (what the viewer opens, a
subtree at a time): the same values ``load`` gives at that path, parts stored apart left as
``Unread(kind, length)``, and only the nodes on the way read."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from cas_checkpoint import (
    CheckpointStore,
    FormatError,
    InvalidArgumentError,
    NotFoundError,
    StatePart,
    Unread,
)
from cas_checkpoint.aio import AsyncCheckpointStore


def messages(n: int, seed: int = 1) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    words = ["plan", "tool", "answer", "query", "agent", "result"]
    return [{"role": "user" if i % 2 == 0 else "assistant",
             "content": f"#{i} " + " ".join(rng.choice(words) for _ in range(60))}
            for i in range(n)]


def filled(value: Any, whole: Any) -> bool:
    """``value`` equals ``whole`` where it was read; an Unread stands for a part of the right
    kind and length."""
    stack = [(value, whole)]
    while stack:
        a, b = stack.pop()
        if type(a) is Unread:
            if a.kind != "value" and (a.kind != type(b).__name__
                                      or a.length not in (None, len(b))):
                return False
        elif isinstance(a, dict):
            if not isinstance(b, dict) or list(a) != list(b):
                return False
            stack.extend((a[k], b[k]) for k in a)
        elif isinstance(a, (list, tuple)):
            if type(a) is not type(b) or len(a) != len(b):
                return False
            stack.extend(zip(a, b, strict=True))
        elif a != b or type(a) is not type(b):
            return False
    return True


def test_parts_are_what_load_gives_there(store: CheckpointStore) -> None:
    state = {"messages": messages(3000), "step": 7, "doc": "z" * 200_000,
             "small": [1, 2.5, None, {"a": (1, 2)}], "blob": bytes(range(256)) * 400,
             "nested": {"k": {"deep": list(range(5000))}}}
    info = store.save("t", state)
    fresh = CheckpointStore.open(store.url, storage_options=getattr(
        store.backend, "fs", None) and dict(store.backend.fs.storage_options)
        if store.url.startswith("s3") else None)
    whole = fresh.read_part("t")
    assert isinstance(whole, StatePart) and whole.checkpoint.id == info.id
    assert whole.checkpoint.thread_id == "t" and whole.path == () and whole.length == 6
    assert filled(whole.value, state)
    assert whole.value["messages"] == Unread("list", 3000)
    assert whole.value["doc"] == Unread("str", 200_000)
    assert whole.bytes_read < 5_000  # the root node alone
    for path, want in ((["messages", -1], state["messages"][-1]),
                       (["messages", 1234, "content"], state["messages"][1234]["content"]),
                       (["doc"], state["doc"]), (["blob"], state["blob"]),
                       (["small", 3, "a"], (1, 2)), (["nested", "k", "deep", 4999], 4999),
                       (["step"], 7)):
        part = fresh.read_part("t", info.id, path)
        assert part.value == want, path
        assert part.path == tuple(path)
    last = fresh.read_part("t", None, ["messages", -1])
    assert last.nodes_read <= 6 and last.bytes_read < info.size / 50, (last.nodes_read,
                                                                       last.bytes_read)
    page = fresh.read_part("t", None, ["messages"], start=2950, count=100)
    assert page.length == 3000 and page.start == 2950 and page.value == state["messages"][2950:]
    assert fresh.read_part("t", None, ["messages"], start=5000).value == []
    deep = fresh.read_part("t", None, ["nested", "k", "deep"], start=10, count=3)
    assert deep.value == [10, 11, 12] and deep.length == 5000


def test_an_older_checkpoint_and_the_errors(store: CheckpointStore) -> None:
    first = store.save("t", {"a": [1, 2, 3], "s": "text"})
    store.save("t", {"a": [4]})
    assert store.read_part("t", first.id, ["a"]).value == [1, 2, 3]
    assert store.read_part("t", None, ["a"]).value == [4]
    with pytest.raises(NotFoundError, match=r"has no key 'b'"):
        store.read_part("t", first.id, ["b"])
    with pytest.raises(NotFoundError, match=r"has 3 items; \[3\]"):
        store.read_part("t", first.id, ["a", 3])
    with pytest.raises(InvalidArgumentError, match=r"is a str: it has no parts"):
        store.read_part("t", first.id, ["s", 0])
    with pytest.raises(InvalidArgumentError, match=r"index it with an int"):
        store.read_part("t", first.id, ["a", "x"])
    with pytest.raises(InvalidArgumentError, match="path must be a list"):
        store.read_part("t", first.id, "a")
    with pytest.raises(InvalidArgumentError, match="count must be"):
        store.read_part("t", first.id, ["a"], count=-1)
    with pytest.raises(NotFoundError):
        store.read_part("nope")
    other = store.save("u", {"x": 1})
    with pytest.raises(NotFoundError):
        store.read_part("t", other.id)  # not in this thread


def test_the_async_face_reads_the_same() -> None:
    sync = CheckpointStore.open("memory://read-part-async", create=True)
    sync.save("t", {"messages": messages(500)})

    async def go() -> Any:
        async with await AsyncCheckpointStore.open("memory://read-part-async") as store:
            return await store.read_part("t", None, ["messages", 499, "role"])

    assert asyncio.run(go()).value == "assistant"


def test_hostile_nodes_are_format_errors() -> None:
    """Nodes that hash right but lie (lengths, shapes, depth): a FormatError, never a wrong
    item, a crash or a hang."""
    import msgpack
    from test_diff import _link, _node

    from cas_checkpoint.format.objects import ObjectId, object_id
    from cas_checkpoint.format.placeholders import Ref, Span
    from cas_checkpoint.query.part import _Walk, walk_to
    from cas_checkpoint.query.walk import Reader, Tally
    from cas_checkpoint.tree.shapes import DICT, LIST, VALUE

    nodes: dict[str, bytes] = {}

    def read(root: str, path: list[Any], start: int = 0, count: int = 100) -> Any:
        def get(oid: ObjectId) -> bytes:
            data = nodes[oid]
            assert object_id(data) == oid
            return data
        return walk_to(_Walk(Reader(get, None, Tally(1 << 24))), ObjectId(root), path, start,
                       count)

    two = _node(nodes, VALUE, msgpack.packb([1, 2]))
    three = _node(nodes, VALUE, msgpack.packb([3, 4, 5]))
    a_dict = _node(nodes, VALUE, msgpack.packb({"a": 1}))

    def span_of(shape: int, kids: tuple[str, ...], lengths: tuple[int, ...] | None) -> str:
        return _node(nodes, VALUE, b"\x81\xa1m" + _link(Span(shape, 0, len(kids), lengths)),
                     kids)

    fine = span_of(LIST, (two, three), (2, 3))
    assert read(fine, ["m", 3]) == (4, None, 0)
    assert read(fine, ["m"], 1, 3) == ([2, 3, 4], 5, 1)
    assert read(fine, []) == ({"m": Unread("list", 5)}, 1, 0)
    cases = {
        "a leaf holds fewer than said": (span_of(LIST, (two,), (3,)), ["m", 2]),
        "a leaf holds more than said": (span_of(LIST, (three,), (2,)), ["m", 1]),
        "a list of a dict": (span_of(LIST, (a_dict,), (1,)), ["m", 0]),
        "a dict of a list": (span_of(DICT, (two,), (2,)), ["m", "a"]),
        "garbage": (_node(nodes, VALUE, b"\xc1\xc1"), []),
        "a child out of range": (_node(nodes, VALUE, b"\x91" + _link(Ref(3)), (two,)), [0]),
    }
    for what, (root, path) in cases.items():
        with pytest.raises(FormatError):
            read(root, path)
            pytest.fail(what)
    deep = two  # a chain of nodes, each a list holding the next: refused at MAX_DEPTH
    for _ in range(1100):
        deep = _node(nodes, VALUE, b"\x91" + _link(Ref(0)), (deep,))
    with pytest.raises(FormatError):
        read(deep, [0] * 1100)
    alone = two  # each node's value is the next node alone
    for _ in range(1100):
        alone = _node(nodes, VALUE, _link(Ref(0)), (alone,))
    with pytest.raises(FormatError):
        read(alone, [])
