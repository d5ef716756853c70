"""Structural sharing: large states split into content-defined nodes that consecutive and
forked checkpoints share."""

from __future__ import annotations

import math
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cas_checkpoint import CheckpointStore
from cas_checkpoint.format.objects import decode_node
from cas_checkpoint.tree import build as tree
from cas_checkpoint.tree import index as treeindex
from cas_checkpoint.tree.cuts import LEAF_MAX_ITEMS
from cas_checkpoint.tree.shapes import COUNTED


def fetcher(objects: dict[str, bytes]) -> Any:
    return lambda ids: {i: objects[i] for i in ids}


def roundtrip(value: Any) -> tree.Built:
    built = tree.build(value)
    back = tree.load(built.root, fetcher(built.objects))
    assert back == value and type(back) is type(value)
    return built


def message(i: int, size: int = 300) -> dict[str, Any]:
    return {"role": "user", "content": f"{i}:" + "x" * size, "n": i}


def test_small_state_is_one_node() -> None:
    built = roundtrip({"messages": [message(1, 20)], "step": 1})
    assert len(built.objects) == 1


def test_every_splittable_kind_roundtrips() -> None:
    for value in ([message(i) for i in range(300)], tuple(range(5000)),
                  {f"key{i}": [i, str(i)] for i in range(2000)}, "héllo wörld " * 20000,
                  bytes(range(256)) * 1000, {"a": {"b": [message(i) for i in range(100)]}},
                  [("x" * 70000, i) for i in range(3)], [{"big": "y" * 100_000}]):
        built = roundtrip(value)
        assert len(built.objects) > 1


@given(st.lists(st.tuples(st.sampled_from(["append", "pop", "insert", "replace", "dict"]),
                          st.integers(0, 10_000), st.integers(0, 2000)),
                min_size=1, max_size=30))
@settings(max_examples=40, deadline=None)
def test_random_edits_roundtrip_at_every_step(edits: list[tuple[str, int, int]]) -> None:
    state: dict[str, Any] = {"messages": [message(i, 100) for i in range(60)], "meta": {}}
    for op, pos, size in edits:
        msgs = state["messages"]
        if op == "append":
            msgs.append(message(pos, size))
        elif op == "pop" and msgs:
            msgs.pop(pos % len(msgs))
        elif op == "insert":
            msgs.insert(pos % (len(msgs) + 1), message(pos, size))
        elif op == "replace" and msgs:
            msgs[pos % len(msgs)] = message(-pos, size)
        else:
            state["meta"][f"k{pos}"] = {"nested": [size] * (size % 50)}
        roundtrip(state)


def new_nodes(before: tree.Built, after: tree.Built) -> int:
    return len(set(after.objects) - set(before.objects))


@pytest.mark.parametrize("long_list", [64, 1 << 40])
def test_append_and_middle_edit_write_few_nodes(monkeypatch: pytest.MonkeyPatch,
                                                long_list: int) -> None:
    monkeypatch.setattr(tree, "LONG_LIST", long_list)  # two tiers, or every leaf small
    msgs = [message(i) for i in range(3000)]
    base = tree.build({"messages": msgs, "step": 1})
    appended = tree.build({"messages": [*msgs, message(99999)], "step": 2})
    middle = list(msgs)
    middle[1500] = message(-1)
    edited = tree.build({"messages": middle, "step": 1})
    inserted = tree.build({"messages": msgs[:700] + [message(-2)] + msgs[700:], "step": 1})
    # (two tiers: ~70 closed 16 KB regions, ~140 nodes; one leaf a message: ~4,000 nodes; an
    # edit in a closed region rewrites its one big leaf)
    assert len(base.objects) > (100 if long_list < len(msgs) else 300)
    # O(log n), not the suffix: per level, the group holding the edit and perhaps a neighbour it
    # merges with or splits from, plus the spine and top. Over 60 random edits of each kind in
    # these 3,000 messages (~4,000 nodes) the median was 11-13 new nodes and the most 24.
    bound = 4 * math.ceil(math.log(len(base.objects), treeindex.FANOUT)) + 4
    for other in (appended, edited, inserted):
        assert new_nodes(base, other) <= bound, (new_nodes(base, other), bound)


def test_long_list_loads_from_few_big_leaves_and_appends_stay_small(
        monkeypatch: pytest.MonkeyPatch) -> None:
    n = tree.LONG_LIST + 1000
    msgs = [message(i, 60 + i % 200) for i in range(n)]
    built = tree.build({"messages": msgs})
    total = sum(len(d) for d in built.objects.values())
    with monkeypatch.context() as m:
        m.setattr(tree, "LONG_LIST", 1 << 40)
        small = len(tree.build({"messages": msgs}).objects)  # every leaf ~256 bytes
    # ~16 KB closed regions, fine leaves only in the open tail: far fewer nodes to read
    assert len(built.objects) * 5 < small, (len(built.objects), small)
    assert max(len(d) for d in built.objects.values()) > 16 * 1024
    assert tree.load(built.root, fetcher(built.objects)) == {"messages": msgs}
    written = []
    for k in range(60):
        msgs.append(message(n + k, 60 + k % 200))
        after = tree.build({"messages": msgs})
        written.append(sum(len(after.objects[o]) for o in set(after.objects) - set(built.objects)))
        built = after
    written.sort()
    # most appends rewrite one small tail leaf and the top; now and then one closes a region
    assert written[len(written) // 2] < 4096 and written[-1] < total, written
    assert tree.load(built.root, fetcher(built.objects)) == {"messages": msgs}


@given(st.integers(1, 400))
@settings(max_examples=25, deadline=None)
def test_nodes_written_per_append_stay_bounded(n: int) -> None:
    msgs = [message(i, 50 + (i * 37) % 400) for i in range(n)]
    before = tree.build({"messages": msgs})
    after = tree.build({"messages": [*msgs, message(n)]})
    assert new_nodes(before, after) <= 10


def test_splitting_is_deterministic_across_processes() -> None:
    script = ("from cas_checkpoint.tree import build as tree\n"
              "v = {'m': [{'c': 'x' * (i % 500), 's': {i, i + 1}} for i in range(3000)]}\n"
              "print(tree.build(v).root)")
    roots = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            check=True, env={"PYTHONHASHSEED": str(seed)}).stdout.strip()
             for seed in (1, 2)}
    value = {"m": [{"c": "x" * (i % 500), "s": {i, i + 1}} for i in range(3000)]}
    assert roots == {tree.build(value).root}


def test_hostile_dag_does_not_explode() -> None:
    # a chain of LIST nodes each listing its child twice: 2**40 leaves if expanded naively
    leaf = tree._Builder(None)
    child = leaf.node(tree.VALUE, bytes([0x91, 0x01]))
    for _ in range(40):
        child = leaf.node(tree.LIST, b"", [child, child])
    import pytest

    from cas_checkpoint import FormatError

    with pytest.raises(FormatError):
        tree.load(child, fetcher(leaf.objects))


def test_split_values_are_joined_by_spans_and_bad_spans_are_refused() -> None:
    import pytest

    from cas_checkpoint import FormatError
    from cas_checkpoint.format import codec

    state = {"messages": [message(i) for i in range(40)], "step": 3}
    built = tree.build(state)
    children, payload = decode_node(built.objects[built.root])
    assert len(children) > 1 and b"\xc7" in bytes(payload)  # the list's top node is inline
    assert tree.load(built.root, fetcher(built.objects)) == state
    b = tree._Builder(None)
    leaf = b.node(tree.VALUE, codec.encode([1, 2]))
    for span in (codec.Span(tree.LIST, 0, 2), codec.Span(tree.LIST, 1, 1),
                 codec.Span(tree.VALUE, 0, 1), codec.Span(tree.BYTES + 1, 0, 1)):
        root = b.node(tree.VALUE, b"\x81\xa1m" + codec.encode_link(span), [leaf])
        with pytest.raises(FormatError, match="children|joins children"):
            tree.load(root, fetcher(b.objects))
    good = b.node(tree.VALUE, b"\x81\xa1m" + codec.encode_link(codec.Span(tree.TUPLE, 0, 1)),
                  [leaf])
    assert tree.load(good, fetcher(b.objects)) == {"m": (1, 2)}


def _thread_objects(store: CheckpointStore, thread: str) -> dict[str, bytes]:
    ref = store.refs.read(thread)
    assert ref is not None
    view = store.objects.view(ref.head)
    return {oid: view.get(oid) for oid in view.ids()}


def test_store_saves_write_only_new_nodes_and_fork_shares_all(store: CheckpointStore) -> None:
    n = 300 if store.url.startswith("s3") else 1000
    state: dict[str, Any] = {"messages": [message(i) for i in range(n)], "step": 0}
    store.save("t", state)
    before = _thread_objects(store, "t")
    state["messages"].append(message(n))
    state["step"] = 1
    c2 = store.save("t", state)
    added = {k: v for k, v in _thread_objects(store, "t").items() if k not in before}
    node_bytes = sum(len(d) for d in added.values() if d[:4] == b"CASN")
    assert 0 < node_bytes < 4 * 1024, node_bytes  # about one message, not a copy of them all
    assert store.load("t").state == state
    # a fork shares every object: it writes no pack
    packs = {i.key for i in store.backend.list("packs")}
    store.fork("t", c2.id, "fork")
    assert {i.key for i in store.backend.list("packs")} == packs
    assert _thread_objects(store, "fork").keys() >= {c2.id}
    stats = store.stats()
    assert stats.checkpoints == 2 and stats.logical_bytes > 1.5 * stats.physical_bytes
    assert stats.dedup_ratio == stats.logical_bytes / stats.physical_bytes


def test_cold_load_reads_the_ref_then_its_packs_in_one_round(tmp_path: Any) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    state: dict[str, Any] = {"messages": []}
    for i in range(300):  # enough saves for several merged packs
        state["messages"].append(message(i))
        store.save("t", state)
    ref = store.refs.read("t")
    assert ref is not None and len(ref.head.packs) >= 2
    fresh = CheckpointStore.open(str(tmp_path / "s"))
    calls: list[list[str]] = []
    real = fresh.objects.backend.get_many

    def counting(keys: Any) -> Any:
        keys = list(keys)
        calls.append(keys)
        return real(keys)

    fresh.objects.backend.get_many = counting  # type: ignore[method-assign]
    assert fresh.load("t").state == state
    assert len(calls) == 1 and sorted(calls[0]) == sorted(
        f"packs/{p.id[:2]}/{p.id[2:]}" for p in ref.head.packs)
    assert fresh.load("t").state == state and len(calls) == 1  # warm: from the cache


def test_a_store_written_with_the_old_cut_loads_and_its_threads_go_on(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread saved with the list cut before the two tiers started at 64 items loads as it
    is (nodes are found by id); the first save after the change cuts the list the new way (its
    leaves are written again, once), and the saves after it write about one message."""
    url = str(tmp_path / "s")
    state: dict[str, Any] = {"messages": [message(i, 60 + i % 300) for i in range(1000)]}
    with monkeypatch.context() as m:
        old_cut(m)
        old_store = CheckpointStore.open(url)
        first = old_store.save("t", state)
        state["messages"].append(message(1000))
        old_store.save("t", state)
        before = _thread_objects(old_store, "t")
        old_built = tree.build(state)
    assert tree.build(state).root != old_built.root  # (the cut did change for this list)
    fresh = CheckpointStore.open(url)
    assert fresh.load("t").state == state
    sizes = []
    for k in range(3):
        state["messages"].append(message(2000 + k))
        fresh.save("t", state)
        after = _thread_objects(fresh, "t")
        sizes.append(sum(len(d) for o, d in after.items() if o not in before and
                         d[:4] == b"CASN"))
        before = after
    raw = sum(len(d) for d in old_built.objects.values())
    assert sizes[0] > raw // 2 and max(sizes[1:]) < 4 * 1024, (sizes, raw)
    again = CheckpointStore.open(url)
    assert again.load("t").state == state
    assert again.load("t", first.id).state["messages"] == state["messages"][:1000]


def test_leaf_children_are_decodable_nodes() -> None:
    built = tree.build({"messages": [message(i) for i in range(500)]})
    for oid, data in built.objects.items():
        children, payload = decode_node(data)
        assert payload[0] == tree.VALUE or payload[0] - COUNTED in (
            tree.LIST, tree.TUPLE, tree.DICT, tree.STR, tree.BYTES)
        assert all(c in built.objects for c in children), oid


@pytest.mark.parametrize("lengths_kept", [tree.Memo.LENGTHS, 150])
def test_a_memo_never_changes_what_is_built(monkeypatch: pytest.MonkeyPatch,
                                            lengths_kept: int) -> None:
    """Builds that reuse a memo give exactly the nodes of a build from scratch, through appends,
    pops, edits in the middle and at the start, and unrelated lists sharing the memo (also when
    the memo's shared node lengths are emptied between builds: kept leaves are entered again)."""
    import random

    monkeypatch.setattr(tree.Memo, "LENGTHS", lengths_kept)
    rng = random.Random(7)
    memo = tree.Memo()
    long = [message(i) for i in range(tree.LONG_LIST + 20)]
    for step in range(12):  # a long list: closed regions reused, the open one cut again
        long.append(message(50_000 + step)) if step % 3 else long.pop(rng.randrange(len(long)))
        got, want = tree.build(long, memo=memo), tree.build(long)
        assert got.root == want.root and got.objects == want.objects, step
    items = [message(i) for i in range(400)]
    other = [message(i) for i in range(50)]
    for step in range(60):
        op = rng.randrange(5)
        if op == 0:
            items.append(message(1000 + step))
        elif op == 1 and items:
            items.pop()
        elif op == 2:
            items[rng.randrange(len(items))] = message(2000 + step)
        elif op == 3:
            items.insert(0, {"role": "system", "content": "x" * rng.randrange(10, 900)})
        else:
            other.append(step)
        for state in ({"messages": items, "step": step}, {"messages": other}, list(items)):
            got, want = tree.build(state, memo=memo), tree.build(state)
            assert got.root == want.root and got.objects == want.objects, (step, op)
            objs = got.objects
            assert tree.load(got.root, lambda ids, o=objs: {i: o[i] for i in ids}) == state
    assert memo.hits > 10_000  # the memo was used, not bypassed
    assert (memo.gen > 5) == (lengths_kept < 1000)


@pytest.mark.parametrize("limit", [LEAF_MAX_ITEMS, 24])
def test_a_memo_gives_the_same_nodes_over_random_appends_edits_and_rewinds(
        monkeypatch: pytest.MonkeyPatch, limit: int) -> None:
    """The memo keeps a list's closed regions and its open region's small leaves: over random
    appends (small items, ints, items that close a region, items big enough for a subtree),
    edits in the middle, pops and rewinds to an earlier state (a region that closed and is
    undone), as a list, a tuple and a dict's value, across ``LONG_LIST`` both ways, and with
    leaves ending at the item limit, a build with the memo gives exactly the nodes of one
    without."""
    import random

    from cas_checkpoint.tree import cuts

    monkeypatch.setattr(tree, "LEAF_MAX_ITEMS", limit)
    monkeypatch.setattr(cuts, "LEAF_MAX_ITEMS", limit)
    if limit < 100:  # and the memo's shared node lengths emptied now and then
        monkeypatch.setattr(tree.Memo, "LENGTHS", 300)
    rng = random.Random(limit)
    memo = tree.Memo()
    items: list[Any] = [message(i, 40) for i in range(tree.LONG_LIST - 10)]
    history: list[list[Any]] = []
    kinds = set()
    for step in range(400):
        op = rng.randrange(12)
        if op < 4:
            items.append(message(step, rng.choice([0, 30, 200, 400, 900])))
        elif op == 4:  # always closes a region (and a leaf): at least LONG_LEAF_TARGET bytes
            items.append("r" * (tree.LONG_LEAF_TARGET + rng.randrange(500)))
        elif op == 5 and items:
            items[rng.randrange(len(items))] = message(-step, rng.randrange(600))
        elif op == 6 and history:  # a rewind
            items = list(rng.choice(history))
        elif op == 7:
            del items[max(0, len(items) - rng.randrange(1, 30)):]
        elif op == 8 and rng.random() < 0.3:  # a subtree of its own: not the memo's path
            items.append(["s" * 1000] * 70)
        elif op == 9:
            items += range(rng.randrange(1, 60))
        else:
            items.append(message(step, 100))
        history.append(list(items))
        kinds.add((len(items) >= tree.LONG_LIST, op))
        for state in (items, {"m": tuple(items), "step": step}, {"m": items}):
            got, want = tree.build(state, memo=memo), tree.build(state)
            assert got.root == want.root and got.objects == want.objects, (step, op)
        if step % 40 == 0:
            assert tree.load(got.root, fetcher(got.objects)) == state
    assert len(kinds) > 16 and memo.hits > 50_000, (kinds, memo.hits)
    assert (memo.gen > 3) == (limit < 100)


_DEEP_SCRIPT = """
import sys, threading
from cas_checkpoint import CheckpointStore, FormatError, SerializationError
depth, url, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
store = CheckpointStore.open(url)
state = {"v": 0}
for i in range(depth):
    state = {"pad": "x" * 1100, "next": state}
out = {}
def run():
    try:
        if mode == "save":
            store.save("deep", state)
            out["r"] = "saved"
        else:
            same = CheckpointStore.open(url).load("deep").state == state
            out["r"] = "loaded" if same else "wrong"
    except SerializationError as exc:
        out["r"] = "refused-save: " + str(exc)[:60]
    except FormatError as exc:
        out["r"] = "refused-load: " + str(exc)[:60]
threading.stack_size(1 << 20)  # a small thread stack, as servers use
t = threading.Thread(target=run)
t.start(); t.join()
print(out.get("r"))
"""


def _run_deep(depth: int, url: str, mode: str) -> str:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _DEEP_SCRIPT, str(depth), url, mode],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])  # no SIGSEGV
    return proc.stdout.strip()


def test_whatever_save_accepts_load_returns_in_a_small_thread_stack(tmp_path: Any) -> None:
    """Nested values of over 1 KB each become a node level each, down to the split limit, and
    the rest is one node: the loader walks them with an explicit stack (no C-stack recursion per
    level), so in a 1 MB thread stack every depth saves and loads; past what the codec encodes
    (1,023 dicts around a value), save refuses with SerializationError. (tests/test_deep_states
    checks more kinds and depths.)"""
    from cas_checkpoint.tree.shapes import MAX_NEST

    for depth in (25, 200, MAX_NEST - 1, 700):
        url = str(tmp_path / f"d{depth}")
        assert _run_deep(depth, url, "save") == "saved", depth
        assert _run_deep(depth, url, "load") == "loaded", depth
    assert _run_deep(1100, str(tmp_path / "d1100"), "save").startswith("refused-save")


def test_a_hostile_chain_of_tiny_nodes_is_a_format_error_not_a_crash(tmp_path: Any) -> None:
    """200 tiny nodes, each naming the next by Ref: the old loader died with SIGSEGV."""
    import subprocess
    import sys

    script = """
import threading
from cas_checkpoint.format import codec
from cas_checkpoint.tree import build as tree
from cas_checkpoint import FormatError
b = tree._Builder(None)
child = b.node(tree.VALUE, codec.encode(1))
for depth in range(int(__import__("sys").argv[1])):
    child = b.node(tree.VALUE, b"\\x91" + codec.encode_link(codec.Ref(0)), [child])
out = {}
def run():
    try:
        out["r"] = repr(tree.load(child, lambda ids: {i: b.objects[i] for i in ids}))[:30]
    except FormatError as exc:
        out["r"] = "format-error"
threading.stack_size(1 << 20)
t = threading.Thread(target=run); t.start(); t.join()
print(out["r"])
"""
    for depth, want in ((200, "[[[[["), (5000, "format-error")):
        proc = subprocess.run([sys.executable, "-c", script, str(depth)], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip().startswith(want), (depth, proc.stdout)


def test_a_hostile_dag_cannot_expand_into_gigabytes() -> None:
    """A 60 KB leaf named 999 times by a node named 999 times: ~60 GB if expanded. The budget
    comes from the distinct bytes read (not from any field an attacker writes)."""
    from cas_checkpoint import FormatError
    from cas_checkpoint.format import codec

    b = tree._Builder(None)
    leaf = b.node(tree.VALUE, codec.encode("x" * 60_000))
    links = b"".join(codec.encode_link(codec.Ref(i)) for i in range(999))
    mid = b.node(tree.VALUE, b"\xdc\x03\xe7" + links, [leaf] * 999)
    top = b.node(tree.VALUE, b"\xdc\x03\xe7" + links, [mid] * 999)
    with pytest.raises(FormatError, match="expands too far"):
        tree.load(top, fetcher(b.objects))
    # and a state that really repeats a value that much is refused when saved
    from cas_checkpoint import SerializationError

    with pytest.raises(SerializationError, match="repeats the same values"):
        tree.build(["y" * 70_000] * 600)


# --- lengths of concatenations' children -------------------------------------------------------

# the same state, built by the code before lengths existed: its root id, node count and bytes
# (frozen copies of that encoder's output: ``tree.WRITE_LENGTHS = False`` with the list cut of
# that time, ``OLD_CUT``, must reproduce it)
OLD_LAYOUT = {50: ("6e575dbf20e2404fdd9ec1e988bcc5d323780874e7935404d5ce0803870e296c", 145,
                   193432),
              5000: ("594d054436b503ae713e797f14ea611785cec698ce7eb62a7048c2d7d6e9f628", 285,
                     1078335)}


# The list cut before the two tiers started at 64 items (November 2026): stores written then
# hold lists of under 4,096 items as one small leaf per item (or group of ~256 bytes).
OLD_CUT = {"LONG_LIST": 4096, "LONG_LEAF_TARGET": 64 * 1024, "LONG_TAIL_TARGET": 1024}


def old_cut(m: pytest.MonkeyPatch) -> None:
    for name, value in OLD_CUT.items():
        m.setattr(tree, name, value)


def layout_state(n: int) -> dict[str, Any]:
    return {"messages": [{"role": "user" if i % 2 else "ai",
                          "content": f"msg {i} " + "x" * (i % 300)} for i in range(n)],
            "t": tuple(f"item {i} " + "y" * 50 for i in range(300)),
            "keys": {f"k{i}": "v" * (i % 40) for i in range(200)},
            "text": "".join(chr(97 + (i * 7919) % 26) + ("é" if i % 97 == 0 else "")
                            for i in range(90_000)),
            "blob": bytes((i * 31) % 256 for i in range(70_000)),
            "step": 3}


def _shapes(built: tree.Built) -> set[int]:
    return {decode_node(d)[1][0] for d in built.objects.values()}


def test_old_layout_is_reproduced_and_both_layouts_load(monkeypatch: pytest.MonkeyPatch) -> None:
    for n, (root, count, size) in OLD_LAYOUT.items():
        state = layout_state(n)
        with monkeypatch.context() as m:
            old_cut(m)
            counted = tree.build(state)  # the same cut, with lengths
            m.setattr(tree, "WRITE_LENGTHS", False)
            old = tree.build(state)
        assert (old.root, len(old.objects), sum(map(len, old.objects.values()))) == (
            root, count, size)
        assert not any(s & COUNTED for s in _shapes(old))
        assert {s & COUNTED for s in _shapes(counted)} == {0, COUNTED} and counted.root != root
        counted_size = sum(map(len, counted.objects.values()))
        assert size < counted_size < size * 1.01  # lengths cost well under 1% of the bytes
        new = tree.build(state)  # today's cut (and lengths)
        assert {s & COUNTED for s in _shapes(new)} == {0, COUNTED} and new.root != root
        for built in (old, counted, new):
            assert tree.load(built.root, fetcher(built.objects)) == state
        # the same state always gives the same nodes
        assert tree.build(state, memo=tree.Memo()).root == new.root


def _varints(*values: int) -> bytes:
    from cas_checkpoint.format.placeholders import varint
    return b"".join(map(varint, values))


def test_lying_lengths_are_refused() -> None:
    from cas_checkpoint import FormatError
    from cas_checkpoint.format import codec
    b = tree._Builder(None)
    two = b.node(tree.VALUE, codec.encode([1, 2]))
    three = b.node(tree.VALUE, codec.encode([3, 4, 5]))
    ab = b.node(tree.VALUE, codec.encode("ab"))
    cde = b.node(tree.VALUE, codec.encode("cdé"))
    L, S = tree.LIST | COUNTED, tree.STR | COUNTED
    good = b.node(L, _varints(2, 3), [two, three])
    inner = b.node(L, _varints(2, 2), [two, two])
    good_text = b.node(S, _varints(2, 3), [ab, cde])
    nested = b.node(L, _varints(4, 3), [inner, three])
    assert tree.load(good, fetcher(b.objects)) == [1, 2, 3, 4, 5]
    assert tree.load(good_text, fetcher(b.objects)) == "abcdé"
    assert tree.load(nested, fetcher(b.objects)) == [1, 2, 1, 2, 3, 4, 5]
    span = codec.Span(tree.LIST, 0, 2, (2, 3))
    assert tree.load(b.node(tree.VALUE, b"\x81\xa1m" + codec.encode_link(span), [two, three]),
                     fetcher(b.objects)) == {"m": [1, 2, 3, 4, 5]}
    bad = {
        "list says 3 + 2": b.node(L, _varints(3, 2), [two, three]),
        "list says 2 + 2": b.node(L, _varints(2, 2), [two, three]),
        "one length for two children": b.node(L, _varints(5), [two, three]),
        "three lengths for two children": b.node(L, _varints(2, 3, 0), [two, three]),
        "a length not minimal": b.node(L, b"\x82\x00\x03", [two, three]),
        "a cut-off length": b.node(L, b"\x02\x83", [two, three]),
        "an old node with bytes after its shape": b.node(tree.LIST, b"\x02\x03", [two, three]),
        "an inner node lies": b.node(L, _varints(4, 3), [b.node(L, _varints(1, 3), [two, two]),
                                                        three]),
        "an outer node lies": b.node(L, _varints(5, 3), [inner, three]),
        "characters": b.node(S, _varints(2, 4), [ab, cde]),
        "counted value shape": b.node(tree.VALUE | COUNTED, b"", []),
        "a span lies": b.node(tree.VALUE, b"\x81\xa1m" + codec.encode_link(
            codec.Span(tree.LIST, 0, 2, (3, 2))), [two, three]),
        "a span of a str lies": b.node(tree.VALUE, b"\x81\xa1m" + codec.encode_link(
            codec.Span(tree.STR, 0, 2, (2, 2))), [ab, cde]),
    }
    for what, oid in bad.items():
        with pytest.raises(FormatError):
            tree.load(oid, fetcher(b.objects))
            pytest.fail(what)
    with pytest.raises(FormatError, match="Span"):  # lengths missing or extra in a span
        codec.decode(b"\xc7\x04\x10\x01\x00\x02\x02", span=lambda *f: f)
    with pytest.raises(FormatError, match="Span"):
        codec.decode(b"\xc7\x06\x10\x01\x00\x02\x02\x03\x04", span=lambda *f: f)
    assert codec.decode(b"\xc7\x05\x10\x01\x00\x02\x02\x03", span=lambda *f: f) == (
        1, 0, 2, (2, 3))
    assert codec.encode_link(codec.Span(1, 0, 2, (2, 3))) == b"\xc7\x05\x10\x01\x00\x02\x02\x03"


def test_an_append_hashes_and_groups_only_what_follows_the_unchanged_part(
        monkeypatch: Any) -> None:
    """With a memo, appending one item to a 2,000-item list hashes a few nodes and tests a few
    index boundaries, not one per leaf (the same nodes as a build from scratch: see above)."""
    items = [message(i) for i in range(2000)]
    memo = tree.Memo()
    tree.build({"messages": items}, memo=memo)
    counts = {"closes": 0, "hashed": 0}
    closing, object_id = treeindex._closing, tree.object_id

    def counting_closes(level: Any, first: int, depth: int) -> list[bool]:
        got = closing(level, first, depth)
        counts["closes"] += len(got)  # index boundaries tested
        return got

    def counting_id(data: Any) -> Any:
        counts["hashed"] += 1
        return object_id(data)

    monkeypatch.setattr(treeindex, "_closing", counting_closes)
    monkeypatch.setattr(tree, "object_id", counting_id)  # (leaves, and index nodes below)
    monkeypatch.setattr(treeindex, "object_id", counting_id)
    items.append(message(5000))
    got = tree.build({"messages": items}, memo=memo)
    assert counts["closes"] <= 4 * treeindex.INDEX_MAX and counts["hashed"] <= 12, counts
    monkeypatch.undo()
    assert got.objects == tree.build({"messages": items}).objects


# Digests of every node id of these states, as the code before the vectorised leaf and index
# builders made them (with and without a memo): node ids never change, or stores lose sharing.
# Digests of the node ids of each state below. Those of "msgs", "small", "long", "tuple",
# "nested" and "big" changed once, deliberately (November 2026): lists of 64 items or more
# (not 4,096) are cut in two tiers, 16 KB closed regions (not 64 KB) and an open region cut as
# a short list is (``tree.LONG_*``). Their old digests are in ``_OLD_CUT_IDS`` and must still
# come out of the old constants (``OLD_CUT``): only the cut moved. "layout", "tiny" and "limit"
# (no list of 64 items or more with a closed 16 KB region) kept theirs.
_IDS = {"layout": "40e3d53291aedd87a0766d1bc2b78721", "msgs": "c43eb9c2b464547da73509422363d897",
        "small": "6df0d3bece957ed4e49dac235ca50dea", "tiny": "ce4d1b1359a98bb9e9b51aec1d5c3279",
        "long": "36b4832b26ea7e3b793c91b0a828119b", "tuple": "19b9bd4a9dacd7c8f39102d48b1356c0",
        "nested": "a8766d73f5514b62732bf68fead6b073",
        "big": "1c2eb572263fd85b111aa355172cda33",
        # a long list whose last region ends at the item limit: one leaf, as a store (with a
        # memo) always wrote it; a build without a memo used to cut it small (other ids)
        "limit": "d268216bb408794fe17e507a5071bf30"}
_OLD_CUT_IDS = {"msgs": "23652b59028be0778b3ab87b9b31ae8d",
                "small": "1ff11e4e4b8449fa6e41fbf3480b53ea",
                "long": "6f36c0988006cafc4376b62994b61fae",
                "tuple": "941f726e1b1f6adf5f8b0082c3f7fca2",
                "nested": "f31da390b5a9cc7d579e4c172115c068",
                "big": "450326eef99e4b4f7663150d61fc1ebe"}


def _id_states() -> dict[str, Any]:
    return {"layout": layout_state(50),
            "msgs": {"messages": [message(i, (i * 37) % 700) for i in range(1000)], "step": 1},
            "small": {"messages": [message(i, i % 40) for i in range(3000)]},
            "tiny": [i % 7 for i in range(3000)],
            "long": [message(i, 60 + i % 200) for i in range(6000)],
            "tuple": tuple(message(i) for i in range(500)),
            "nested": {"a": [[message(j) for j in range(i % 9)] for i in range(300)],
                       "b": {f"k{i}": [i] * 300 for i in range(80)}},
            "big": {"m": [message(i) for i in range(200)] + ["z" * 70000] +
                    [message(i) for i in range(50)]},
            "limit": {"m": list(range(5120))}}


@pytest.mark.parametrize(("name", "cut"), [(name, "new") for name in _IDS] +
                         [(name, "old") for name in _OLD_CUT_IDS])
def test_node_ids_do_not_change(monkeypatch: pytest.MonkeyPatch, name: str, cut: str) -> None:
    import hashlib

    state = _id_states()[name]
    if cut == "old":
        old_cut(monkeypatch)
    want = (_IDS if cut == "new" else _OLD_CUT_IDS)[name]
    for built in (tree.build(state), tree.build(state, memo=tree.Memo())):
        digest = hashlib.blake2b(digest_size=16)
        for oid in sorted(built.objects):
            digest.update(oid.encode())
        assert digest.hexdigest() == want
        assert tree.load(built.root, fetcher(built.objects)) == state


@pytest.mark.parametrize("count", [40, 52])
def test_a_chat_of_16_items_or_more_loads_from_its_closed_regions(
        monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """A list of 16 to 63 items over ~16 KB (a conversation of a few dozen messages) is cut in
    two tiers as a longer one is: its closed regions are one leaf each, so a cold read fetches
    well under half the nodes of the one-leaf-a-message cut (main before session 16: the two
    tiers from 64 items on, so the two builds here were the same)."""
    items = [message(i, 800) for i in range(count)]
    state = {"messages": items, "step": count}
    now = tree.build(state)
    assert tree.load(now.root, lambda ids: {i: now.objects[i] for i in ids}) == state
    monkeypatch.setattr(tree, "LONG_LIST", 64)
    before = tree.build(state)
    assert len(now.objects) * 2 < len(before.objects), (len(now.objects), len(before.objects))
