"""store.diff: exact changes (against a plain-Python diff of the loaded states), few node reads
for neighbours of a big state, hostile nodes refused, deep values without C recursion."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from conftest import open_store
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cas_checkpoint import CasError, CheckpointStore, FormatError
from cas_checkpoint.format.objects import ObjectId, decode_node, encode_node, object_id
from cas_checkpoint.format.placeholders import Ref, Span
from cas_checkpoint.query.diff import Change, Differ, _Counts
from cas_checkpoint.query.walk import Link, Reader, Tally, key_seg, outline, snippet
from cas_checkpoint.tree import build as tree
from cas_checkpoint.tree.shapes import COUNTED, DICT, LIST, STR, VALUE

# --- the oracle: a plain-Python diff of two loaded states ---------------------------------------


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return repr(a) == repr(b)
    return bool(a == b)


def _key(k: Any) -> str:
    return f"[{json.dumps(k, ensure_ascii=False)}]" if type(k) is str else f"[{k!r}]"


LONG = tree.TEXT_SPLIT_MIN  # str/bytes longer than this on both sides: a change of a slice


def text_slice(a: Any, b: Any, path: str) -> list[tuple[str, str, Any, Any]]:
    """The slice from the first to the last differing character, found the slow way."""
    if a == b:
        return []
    p = 0
    while p < min(len(a), len(b)) and a[p] == b[p]:
        p += 1
    s = 0
    while s < min(len(a), len(b)) - p and a[len(a) - 1 - s] == b[len(b) - 1 - s]:
        s += 1
    return [(f"{path}[{p}:{len(a) - s}]", "changed", a[p:len(a) - s], b[p:len(b) - s])]


def oracle(a: Any, b: Any, path: str = "") -> list[tuple[str, str, Any, Any]]:
    if type(a) is not type(b):
        return [(path, "changed", a, b)]
    if type(a) in (str, bytes) and min(len(a), len(b)) > LONG:
        return text_slice(a, b, path)
    out: list[tuple[str, str, Any, Any]] = []
    if type(a) is dict:
        for k, v in a.items():
            if k in b:
                out += oracle(v, b[k], path + _key(k))
            else:
                out.append((path + _key(k), "removed", v, None))
        out += [(path + _key(k), "added", None, v) for k, v in b.items() if k not in a]
    elif type(a) in (list, tuple):
        for i in range(min(len(a), len(b))):
            out += oracle(a[i], b[i], f"{path}[{i}]")
        out += [(f"{path}[{i}]", "removed", a[i], None) for i in range(len(b), len(a))]
        out += [(f"{path}[{i}]", "added", None, b[i]) for i in range(len(a), len(b))]
    elif not _same(a, b):
        out.append((path, "changed", a, b))
    return out


def as_tuples(changes: list[Change]) -> list[tuple[str, str, Any, Any]]:
    return [(c.path, c.op, c.old, c.new) for c in changes]


# --- states and edits -------------------------------------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5),
                    st.floats(allow_nan=False, width=32), st.text(max_size=6),
                    st.binary(max_size=4))
small = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=3), inner, max_size=4),
    st.lists(inner, max_size=3).map(tuple)), max_leaves=12)


def message(rng: random.Random, i: int) -> dict[str, Any]:
    return {"role": rng.choice(["user", "ai", "tool"]), "i": i,
            "content": f"message {i} " + "".join(rng.choice("abcde ") for _ in range(
                rng.randrange(5, 120)))}


@st.composite
def state_pairs(draw: st.DrawFn) -> tuple[Any, Any]:
    seed = draw(st.integers(0, 2**32))
    rng = random.Random(seed)
    size = draw(st.sampled_from([0, 3, 40, 300, 4100, 4300]))
    msgs: list[Any] = [message(rng, i) for i in range(size)]
    text = "".join(rng.choice("abcdefgh \n") for _ in range(draw(st.sampled_from([10, 40_000]))))
    big_keys = {f"k{i}": i for i in range(draw(st.sampled_from([0, 70])))}
    a = {"messages": msgs, "meta": draw(small), "text": text, "keys": big_keys,
         "nested": [[message(rng, j) for j in range(draw(st.integers(0, 12)))]]}
    b = json_copy(a)
    for _ in range(draw(st.integers(0, 5))):
        edit = draw(st.sampled_from(["append", "insert", "delete", "change", "nested", "text",
                                     "key", "meta", "replace"]))
        m = b["messages"]
        at = draw(st.integers(0, max(0, len(m) - 1)))
        if edit == "append":
            m.extend(message(rng, 10_000 + k) for k in range(draw(st.integers(1, 3))))
        elif edit == "insert":
            m.insert(at, message(rng, 20_000))
        elif edit == "delete" and m:
            del m[at]
        elif edit == "change" and m:
            m[at] = dict(m[at], content=m[at]["content"] + "!")
        elif edit == "nested" and m:
            m[at]["extra"] = draw(small)
        elif edit == "text":
            pos = draw(st.integers(0, len(b["text"])))
            b["text"] = b["text"][:pos] + "Z" + b["text"][pos + 1:]
        elif edit == "key":
            b["keys"][draw(st.sampled_from(["k1", "k65", "new"]))] = draw(scalars)
            if "k3" in b["keys"]:
                del b["keys"]["k3"]
        elif edit == "meta":
            b["meta"] = draw(small)
        elif edit == "replace":
            b["nested"][0] = draw(small)
    return a, b


def json_copy(value: Any) -> Any:
    """A deep copy (lists, dicts, tuples; scalars shared)."""
    if type(value) is dict:
        return {k: json_copy(v) for k, v in value.items()}
    if type(value) is list:
        return [json_copy(v) for v in value]
    if type(value) is tuple:
        return tuple(json_copy(v) for v in value)
    return value


@pytest.mark.parametrize("lengths", [True, False], ids=["lengths", "before-lengths"])
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(pair=state_pairs())
def test_diff_matches_plain_python_diff(lengths: bool, pair: tuple[Any, Any]) -> None:
    a, b = pair
    store = CheckpointStore.open(f"memory://diff-{random.getrandbits(64):x}")
    tree.WRITE_LENGTHS = lengths  # False: the layout of stores written before lengths
    try:
        ia = store.save("a", a)
        ib = store.save("b", b)
    finally:
        tree.WRITE_LENGTHS = True
    fresh = CheckpointStore.open(store.url)  # nothing cached: every node comes from storage
    sa, sb = fresh.load("a").state, fresh.load("b").state
    got = fresh.diff(ia.id, ib.id)
    assert as_tuples(got.changes) == oracle(sa, sb)
    back = fresh.diff(ib.id, ia.id)
    assert as_tuples(back.changes) == oracle(sb, sa)
    assert got.a.id == ia.id and got.b.id == ib.id and got.b.thread_id == "b"
    assert fresh.diff(ia.id, ia.id).changes == []


# --- neighbours of a 10,000-message state -----------------------------------------------------


def _messages(n: int) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 else "ai", "content": f"msg {i} " + "x" * 380}
            for i in range(n)]


def _reopen(store: CheckpointStore, request: pytest.FixtureRequest) -> CheckpointStore:
    """A fresh store object on the same storage: nothing cached."""
    if store.url.startswith("s3://"):
        server = request.getfixturevalue("moto_server")
        return CheckpointStore.open(store.url, storage_options=server["storage_options"])
    return CheckpointStore.open(store.url)


# nodes read are the engine's count, the same on every backend: memory and local (conftest's
# backend_kind); a diff through S3's reads is test_diff_on_every_backend's
def test_neighbours_read_few_nodes(backend_kind: str, tmp_path: Any,
                                   request: pytest.FixtureRequest) -> None:
    """Concatenations give their children's lengths: a diff of two neighbours of a big state
    in a fresh store object reads a few nodes on each side, never the shared parts."""
    store = open_store(backend_kind, tmp_path, request)
    msgs = _messages(10_000)
    state = {"messages": msgs, "step": 1}
    c1 = store.save("t", state)
    c2 = store.save("t", {"messages": msgs + [{"role": "ai", "content": "new"}], "step": 2})
    changed = list(msgs) + [{"role": "ai", "content": "new"}]
    changed[5000] = {"role": "ai", "content": "edited"}
    c3 = store.save("t", {"messages": changed, "step": 2})
    items = [f"item {i} " + "y" * (i % 50) for i in range(50_000)]
    c4 = store.save("u", {"items": items})
    c5 = store.save("u", {"items": items[:25_000] + ["changed"] + items[25_001:]})
    rng = random.Random(5)
    text = "".join(rng.choice("abcdefgh \n") for _ in range(1_000_000)) + "é"
    c6 = store.save("v", {"doc": text, "n": 1})
    c7 = store.save("v", {"doc": text[:500_000] + "INSERTED" + text[500_010:], "n": 1})

    assert _shape_bytes(store, "t") == {VALUE, LIST | COUNTED}

    def diff(a: str, b: str) -> Any:
        d = _reopen(store, request).diff(a, b)
        # (a path from the root to each changed place, on each side: the 10,000 messages are
        # ~330 nodes, 16 KB regions, so c1 -> c3, two changed places, reads 21 nodes and 93 KB;
        # with the 64 KB regions of the cut before November 2026, ~90 nodes: 15 and 549 KB)
        assert d.nodes_read <= 24 and d.nodes_counted == 0, (d.nodes_read, d.changes[:3])
        return as_tuples(d.changes)

    assert diff(c1.id, c2.id) == [('["messages"][10000]', "added", None,
                                   {"role": "ai", "content": "new"}),
                                  ('["step"]', "changed", 1, 2)]
    assert diff(c2.id, c3.id) == [
        ('["messages"][5000]["content"]', "changed", "msg 5000 " + "x" * 380, "edited")]
    assert diff(c1.id, c3.id) == [
        ('["messages"][5000]["content"]', "changed", "msg 5000 " + "x" * 380, "edited"),
        ('["messages"][10000]', "added", None, {"role": "ai", "content": "new"}),
        ('["step"]', "changed", 1, 2)]
    assert diff(c4.id, c5.id) == [('["items"][25000]', "changed", items[25_000], "changed")]
    assert diff(c6.id, c7.id) == [('["doc"][500000:500010]', "changed", text[500_000:500_010],
                                   "INSERTED")]
    assert diff(c7.id, c6.id) == [('["doc"][500000:500008]', "changed", "INSERTED",
                                   text[500_000:500_010])]


def _shape_bytes(store: CheckpointStore, thread: str) -> set[int]:
    ref = store.refs.read(thread)
    assert ref is not None
    view = store.objects.view(ref.head)
    out = set()
    for oid in view.ids():
        data = view.get(oid)
        if data[:4] == b"CASN":
            out.add(decode_node(data)[1][0])
    return out


def test_stores_written_before_lengths_still_diff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes without lengths (the layout before them): the shared prefix is counted by reading
    its leaves, a long str is read whole, and the changes are the same."""
    msgs = _messages(10_000)
    store = CheckpointStore.open(f"memory://diff-old-{random.getrandbits(64):x}")
    state = {"messages": msgs, "step": 1}
    with monkeypatch.context() as m:
        m.setattr(tree, "WRITE_LENGTHS", False)
        one_state = len(tree.build(state).objects)
        c1 = store.save("t", state)
        c2 = store.save("t", {"messages": msgs + [{"role": "ai", "content": "new"}], "step": 2})
        changed = list(msgs) + [{"role": "ai", "content": "new"}]
        changed[5000] = {"role": "ai", "content": "edited"}
        c3 = store.save("t", {"messages": changed, "step": 2})
        text = "abcdefgh " * 10_000
        t1 = store.save("v", {"doc": text})
        t2 = store.save("v", {"doc": text[:40_000] + "Z" + text[40_001:]})
    assert _shape_bytes(store, "t") == {VALUE, LIST}  # the old layout: no lengths
    fresh = CheckpointStore.open(store.url)
    d = fresh.diff(c1.id, c2.id)
    assert as_tuples(d.changes) == [('["messages"][10000]', "added", None,
                                     {"role": "ai", "content": "new"}),
                                    ('["step"]', "changed", 1, 2)]
    # the shared prefix is read only to count its items (no index node gives them)
    assert d.nodes_counted > 16 and d.nodes_read - d.nodes_counted <= 16
    assert d.nodes_read <= one_state + 16
    d = fresh.diff(c2.id, c3.id)
    assert as_tuples(d.changes) == [
        ('["messages"][5000]["content"]', "changed", "msg 5000 " + "x" * 380, "edited")]
    # the same store object keeps the counts (by node id): a second diff reads few nodes
    again = fresh.diff(c1.id, c2.id)
    assert again.nodes_read <= 16 and again.nodes_counted == 0
    d = fresh.diff(c1.id, c3.id)
    assert len(d.changes) == 3 and d.nodes_read < one_state
    d = fresh.diff(t1.id, t2.id)
    assert as_tuples(d.changes) == [('["doc"][40000:40001]', "changed", text[40_000], "Z")]
    # a new save on top of the old layout: both diff against each other
    c4 = fresh.save("t", {"messages": changed + [{"role": "x"}], "step": 3})
    assert as_tuples(fresh.diff(c3.id, c4.id).changes) == [
        ('["messages"][10001]', "added", None, {"role": "x"}), ('["step"]', "changed", 2, 3)]
    assert as_tuples(fresh.diff(c4.id, c1.id).changes) == oracle(
        fresh.get(c4.id).state, fresh.get(c1.id).state)


@pytest.mark.parametrize("backend_kind", ["memory", "local", "s3", "memory-async"])
def test_diff_on_every_backend(backend_kind: str, tmp_path: Any,
                               request: pytest.FixtureRequest) -> None:
    store = open_store(backend_kind, tmp_path, request)
    msgs = _messages(300)
    a = store.save("t", {"messages": msgs, "n": 1, "gone": True})
    store.fork("t", a.id, "u")
    b = store.save("u", {"messages": msgs[:-1] + [{"role": "x"}], "n": 2, "new": [1]})
    d = store.diff(a.id, b.id)
    assert as_tuples(d.changes) == oracle(store.get(a.id).state, store.get(b.id).state)
    assert [(c.path, c.op) for c in d.changes] == [
        ('["messages"][299]["role"]', "changed"), ('["messages"][299]["content"]', "removed"),
        ('["n"]', "changed"), ('["gone"]', "removed"), ('["new"]', "added")]
    assert d.a.thread_id == "t" and d.b.thread_id == "u"


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int


class Box:
    """A class with identity equality, stored through an adapter."""

    def __init__(self, value: Any) -> None:
        self.value = value


def test_registered_objects_compare_by_their_stored_data() -> None:
    from cas_checkpoint import TypeRegistry
    types = TypeRegistry([Point])
    types.register(Box, to_data=lambda b: b.value, from_data=Box)
    store = CheckpointStore.open(f"memory://diff-objects-{random.getrandbits(64):x}",
                                 types=types)
    big = [Point(i, i) for i in range(300)]  # a split list of objects
    a = store.save("t", {"p": Point(1, 2), "box": Box(["same"]), "items": big, "n": 1})
    b = store.save("t", {"p": Point(1, 3), "box": Box(["same"]), "n": 1,
                         "items": big[:150] + [Box("other")] + big[151:] + [Point(9, 9)]})
    d = CheckpointStore.open(store.url, types=types).diff(a.id, b.id)
    assert [(c.path, c.op) for c in d.changes] == [
        ('["p"]', "changed"), ('["items"][150]', "changed"), ('["items"][300]', "added")]
    first, second, third = d.changes
    assert (first.old, first.new) == (Point(1, 2), Point(1, 3))
    assert first.old == Point(1, 2) and type(second.new) is Box and second.new.value == "other"
    assert third.new == Point(9, 9) and third.old is None
    assert CheckpointStore.open(store.url, types=types).diff(a.id, a.id).changes == []


def test_diff_arguments() -> None:
    store = CheckpointStore.open("memory://diff-args")
    a = store.save("t", {"x": 1})
    with pytest.raises(CasError, match="not a checkpoint id"):
        store.diff("nope", a.id)
    with pytest.raises(CasError, match="does not exist"):
        store.diff(a.id, "0" * 64)
    d = store.diff(a.id, store.save("t", [1, 2]).id)
    assert as_tuples(d.changes) == [("", "changed", {"x": 1}, [1, 2])]


# --- hostile nodes: a CasError, never a crash ---------------------------------------------------


def _node(nodes: dict[str, bytes], shape: int, body: bytes = b"",
          children: tuple[str, ...] = ()) -> ObjectId:
    data = encode_node(bytes([shape]) + body, children)
    oid = object_id(data)
    nodes[oid] = data
    return oid


def _diff_nodes(nodes: dict[str, bytes], a: str, b: str,
                budget: int = 1 << 24) -> list[Change]:
    def get(oid: ObjectId) -> bytes:
        data = nodes[oid]
        assert object_id(data) == oid
        return data

    tally = Tally(budget)
    readers = (Reader(get, None, tally), Reader(get, None, tally))
    return Differ(readers, _Counts(None)).run(Link(ObjectId(a)), Link(ObjectId(b)))


def _link(x: Ref | Span) -> bytes:
    from cas_checkpoint.format import codec
    return codec.encode_link(x)


def test_hostile_nodes_raise_cas_errors() -> None:
    import msgpack
    nodes: dict[str, bytes] = {}
    good = _node(nodes, VALUE, msgpack.packb([1, 2, 3]))
    a_dict = _node(nodes, VALUE, msgpack.packb({"a": 1}))
    cases = {
        "garbage payload": _node(nodes, VALUE, b"\xc1\xc1"),
        "list of a dict": _node(nodes, LIST, b"", (good, a_dict)),
        "unknown shape": _node(nodes, 9),
        "child out of range": _node(nodes, VALUE, b"\x91" + _link(Ref(3)), (good,)),
        "child twice": _node(nodes, VALUE, b"\x92" + _link(Ref(0)) * 2, (good,)),
        "child as a key": _node(nodes, VALUE, b"\x81" + _link(Ref(0)) + b"\x01", (good,)),
        "span of unknown shape": _node(nodes, VALUE, b"\x91" + _link(Span(9, 0, 1)), (good,)),
        "dict of a list": _node(nodes, VALUE, b"\x91" + _link(Span(DICT, 0, 1)), (good,)),
    }
    other = _node(nodes, VALUE, msgpack.packb([[0]]))
    for what, oid in cases.items():
        with pytest.raises(CasError):
            _diff_nodes(nodes, oid, other)
            pytest.fail(what)
    # a deep chain of nodes: refused at MAX_DEPTH, not a RecursionError
    deep = good
    for _ in range(1100):
        deep = _node(nodes, VALUE, b"\x91" + _link(Ref(0)), (deep,))
    with pytest.raises(FormatError):
        _diff_nodes(nodes, deep, other)
    # a lattice that doubles at each level: the budget stops it (a 1 MB budget, not the 16 MB
    # above: the same proof at 1/16 of the CPU; 60 levels would expand to 2**60 nodes)
    lat_a, lat_b = good, other
    for _ in range(60):
        lat_a = _node(nodes, VALUE, b"\x92" + _link(Ref(0)) + _link(Ref(1)), (lat_a, lat_a))
        lat_b = _node(nodes, VALUE, b"\x92" + _link(Ref(0)) + _link(Ref(1)), (lat_b, lat_b))
    with pytest.raises(FormatError, match="expands too far"):
        _diff_nodes(nodes, lat_a, lat_b, budget=1 << 20)


def test_lying_lengths_are_refused_when_read() -> None:
    import msgpack
    nodes: dict[str, bytes] = {}
    two = _node(nodes, VALUE, msgpack.packb([1, 2]))
    three = _node(nodes, VALUE, msgpack.packb([3, 4, 5]))

    def span_of(shape: int, kids: tuple[str, ...], lengths: tuple[int, ...]) -> str:
        link = _link(Span(shape, 0, len(kids), lengths))
        return _node(nodes, VALUE, b"\x81\xa1m" + link, kids)

    fine = span_of(LIST, (two, three), (2, 3))
    assert _diff_nodes(nodes, fine, span_of(LIST, (two, two), (2, 2))) == [
        Change('["m"][2]', "changed", 3, 1), Change('["m"][3]', "changed", 4, 2),
        Change('["m"][4]', "removed", 5, None)]
    cases = {
        "the same node, two lengths": (span_of(LIST, (two,), (3,)), span_of(LIST, (two,), (2,))),
        "a leaf holds fewer": (span_of(LIST, (two,), (3,)), span_of(LIST, (three,), (3,))),
        "an index node's parts": (
            span_of(LIST, (_node(nodes, LIST | COUNTED, b"\x02\x02", (two, three)),), (4,)),
            span_of(LIST, (_node(nodes, LIST | COUNTED, b"\x02\x02", (two, two)),), (4,))),
    }
    text = _node(nodes, VALUE, msgpack.packb("a" * 40_000))
    five, six = (_node(nodes, VALUE, msgpack.packb(c * 5)) for c in "bc")
    cases["a chunk of text"] = (span_of(STR, (text, five), (40_000, 5)),
                                span_of(STR, (text, six), (40_000, 6)))
    cases["the same chunk of text, two lengths"] = (span_of(STR, (text, five), (40_000, 5)),
                                                    span_of(STR, (text, six), (40_001, 5)))
    assert _diff_nodes(nodes, *cases["a chunk of text"][:1],
                       span_of(STR, (text, six), (40_000, 5))) == [
        Change('["m"][40000:40005]', "changed", "bbbbb", "ccccc")]
    for what, (x, y) in cases.items():
        with pytest.raises(FormatError):
            _diff_nodes(nodes, x, y)
            pytest.fail(what)


def test_damaged_pack_is_an_integrity_error() -> None:
    store = CheckpointStore.open("memory://diff-damaged")
    a = store.save("t", {"m": _messages(200)})
    b = store.save("t", {"m": _messages(201)})
    fs = store.backend.fs
    for path in fs.find(store.backend.root):
        if "/packs/" in path:
            data = bytearray(fs.cat_file(path))
            data[len(data) // 2] ^= 0xFF
            fs.pipe_file(path, bytes(data))
    with pytest.raises(CasError):
        CheckpointStore.open(store.url).diff(a.id, b.id)


# --- walk.py, pure -----------------------------------------------------------------------------


def test_outline_and_paths() -> None:
    import msgpack
    child = ObjectId("ab" * 32)
    body = b"\x82\xa1a" + _link(Ref(0)) + b"\xa1b" + _link(Span(LIST, 1, 2))
    node = outline(ObjectId("cd" * 32), (child, child, child), memoryview(bytes([VALUE]) + body),
                   None)
    assert node.value["a"] == Link(child) and node.value["b"].oids == (child, child)
    plain = outline(ObjectId("cd" * 32), (), memoryview(bytes([VALUE]) + msgpack.packb([1])),
                    None)
    assert plain.value == [1]
    assert key_seg("messages") == '["messages"]' and key_seg(3) == "[3]"
    assert key_seg('a"b\n') == '["a\\"b\\n"]' and eval("{'a\"b\\n': 1}" + key_seg('a"b\n')) == 1
    s = snippet("x" * 100 + "needle\nin" + "y" * 100, 100, 106)
    assert "needle in" in s and "\n" not in s and len(s) <= 90 and s.startswith("…")
    assert snippet("ab", 0, 1) == "ab"


DEEP = textwrap.dedent("""
    import resource, sys
    from cas_checkpoint import CheckpointStore
    def nest(depth, leaf, pad=0):
        v = leaf
        for _ in range(depth):
            v = [v, "p" * pad] if pad else [v]
        return v
    store = CheckpointStore.open("memory://deep")
    a = store.save("t", {"d": nest(1000, "needle one"), "s": nest(50, "x", 1500)})
    b = store.save("t", {"d": nest(1000, "needle two"), "s": nest(50, "y", 1500)})
    d = store.diff(a.id, b.id)
    assert [c.path for c in d.changes] == ['["d"]' + "[0]" * 1000,
                                           '["s"]' + "[0]" * 50], [c.path for c in d.changes]
    r = store.search("NEEDLE")
    assert [m.path for m in r.matches] == ['["d"]' + "[0]" * 1000], r.matches
    print("ok", d.nodes_read)
""")


def test_deep_values_in_a_subprocess() -> None:
    got = subprocess.run([sys.executable, "-c", DEEP], capture_output=True, text=True,
                         timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stdout.startswith("ok")
