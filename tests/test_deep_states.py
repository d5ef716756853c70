"""Deep states: values of over 1 KB nested inside each other far past the split-depth limit
(``shapes.MAX_NEST``). Every state the codec can encode is stored: past the limit the deeper
part is kept whole inside one node (no more node levels), and it loads back in a fresh process
and in a thread with a 1 MB stack. What the codec refuses (lists and dicts nested more than
1,023 deep) is refused on save with SerializationError before anything is written; a hostile
tree past the loader's limits is a FormatError, never a crash. Crash-prone runs (a stack
overflow kills the process) are in subprocesses."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cas_checkpoint import SerializationError
from cas_checkpoint.tree import build as tree
from cas_checkpoint.tree.shapes import MAX_NEST

PAD = 1100  # every level encodes to over 1 KB on its own (SPLIT_MIN)
LIMIT = 1023  # lists and dicts around a value, at most (what the codec writes and reads)

# Builds a deep state of a kind: ``levels`` containers inside each other, the innermost holding
# a >1 KB str, each level also holding its own >1 KB str (so every level is a split value).
_STATES = """
def deep(kind, levels):
    pad = "x" * PAD
    if kind == "dict":
        state = {"pad": pad + "0"}
        for i in range(1, levels):
            state = {"pad": pad + str(i), "next": state}
    elif kind == "list":
        state = [pad + "0"]
        for i in range(1, levels):
            state = [pad + str(i), state]
    else:  # tuples: extension types, at most 64 inside each other (codec.MAX_EXT_DEPTH)
        state = (pad + "0",)
        for i in range(1, levels):
            state = (pad + str(i), state)
    return state
""".replace("PAD", str(PAD))

namespace: dict[str, Any] = {}
exec(_STATES, namespace)  # (the same builder in this process and in the subprocesses)
deep = namespace["deep"]

_SCRIPT = _STATES + """
import json, os, sys, threading
from datetime import timedelta
from cas_checkpoint import CasError, CheckpointStore
from cas_checkpoint.format import codec

def same(a, b):  # (== recurses in C past Python's recursion limit: compare the encodings,
    return codec.encode(a) == codec.encode(b)  # which are deterministic and exact on types)

mode, url, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])

def files():
    return sorted(os.path.relpath(os.path.join(d, f), url)
                  for d, _, fs in os.walk(url) for f in fs)

def in_small_stack(fn):
    out = {}
    def run():
        try:
            out["r"] = fn()
        except CasError as exc:
            out["r"] = [type(exc).__name__, str(exc)[-300:]]
    threading.stack_size(1 << 20)  # a small thread stack, as servers use
    t = threading.Thread(target=run)
    t.start(); t.join()
    return out.get("r", "no result")

results = {}
if mode == "save":
    store = CheckpointStore.open(url)
    for kind, levels in cases:
        before = files()
        def save():
            store.save(f"{kind}-{levels}", deep(kind, levels))
            return "saved"
        got = in_small_stack(save)
        if got != "saved" and files() != before:
            got = ["wrote", got]
        results[f"{kind}-{levels}"] = got
    store.save("garbage", {"junk": "z" * 5000})  # something for gc to delete beside them
    store.delete_thread("garbage")
else:  # load in a fresh process: in a 1 MB thread, in the main thread, then verify and gc
    store = CheckpointStore.open(url)
    for kind, levels in cases:
        thread, state = f"{kind}-{levels}", deep(kind, levels)
        small = in_small_stack(lambda: same(store.load(thread).state, state))
        main = same(CheckpointStore.open(url).load(thread).state, state)
        results[thread] = [small, main]
    report = store.verify(deep=True)
    gc = store.gc(grace=timedelta(0))
    again = CheckpointStore.open(url)
    results["verify"] = [report.ok, report.to_text()[-300:]]
    results["gc_deleted"] = gc.deleted_objects
    results["gc_reachable"] = gc.reachable_objects
    results["after_gc"] = all(in_small_stack(
        lambda: same(again.load(f"{k}-{n}").state, deep(k, n))) for k, n in cases)
print(json.dumps(results))
"""


def _run(mode: str, url: Path, cases: list[tuple[str, int]]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, mode, str(url), json.dumps(cases)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])  # no SIGSEGV
    got: dict[str, Any] = json.loads(proc.stdout)
    return got


_DEEP = [("dict", 60), ("dict", 200), ("dict", 900), ("list", 60), ("list", 200),
         ("list", 900), ("dict", LIMIT), ("list", LIMIT), ("tuple", 60)]


def test_states_nested_past_the_split_limit_save_and_load_in_a_small_stack(
        tmp_path: Path) -> None:
    """60, 200, 900 and 1,023 levels of over 1 KB each (the split limit is 56): each saves in
    a thread with a 1 MB stack, loads back equal in a fresh process (in such a thread and in
    the main thread), a deep verify finds nothing and gc deletes none of it. The old code
    refused every one of them on save ("nests values of over 1024 bytes more than 56 levels")."""
    saved = _run("save", tmp_path, _DEEP)
    assert saved == {f"{k}-{n}": "saved" for k, n in _DEEP}, saved
    loaded = _run("load", tmp_path, _DEEP)
    for kind, levels in _DEEP:
        assert loaded[f"{kind}-{levels}"] == [True, True], (kind, levels, loaded)
    assert loaded["verify"][0] is True, loaded["verify"]
    assert loaded["gc_reachable"] > 0 and loaded["gc_deleted"] > 0, loaded  # (the garbage)
    assert loaded["after_gc"] is True, loaded


def test_past_what_the_codec_encodes_a_save_is_refused_before_anything_is_written(
        tmp_path: Path) -> None:
    """One level past the codec's limit (1,024 lists or dicts around a value): SerializationError
    that names the limit, and the store holds the same files as before the save."""
    over = [("dict", LIMIT + 1), ("list", LIMIT + 1), ("tuple", 70)]
    got = _run("save", tmp_path, over)
    for kind, levels in over:
        name, message = got[f"{kind}-{levels}"]  # (["wrote", ...] if files appeared)
        assert name == "SerializationError", (kind, got)
        assert ("1023 deep" if kind != "tuple" else "64 tuples") in message, message
    with pytest.raises(SerializationError, match="1023 deep"):
        tree.build(deep("list", LIMIT + 1))


@pytest.mark.parametrize("levels", [MAX_NEST + 1, 60, 200, 900])
def test_past_the_split_limit_the_deeper_part_is_one_node(levels: int) -> None:
    """Each of the first ``MAX_NEST`` dicts is a split value (a node, and its >1 KB pad a node
    of its own); everything deeper is one node that holds the rest of the value (no children):
    ``2 * MAX_NEST + 1`` nodes in all, however deep the state. (The old code refused them.)"""
    state = deep("dict", levels)
    built = tree.build(state)
    assert len(built.objects) == 2 * MAX_NEST + 1, (levels, len(built.objects))
    assert tree.load(built.root, lambda ids: {i: built.objects[i] for i in ids}) == state
    for kind in ("list", "tuple"):  # (items under 64 KB are not split values: few nodes)
        small = deep(kind, min(levels, 60))
        objects = tree.build(small).objects
        root = tree.build(small).root
        assert tree.load(root, lambda ids, o=objects: {i: o[i] for i in ids}) == small


# Digests of the node ids of states that were storable before deep states were, and how many
# nodes they have, as the code that refused deeper states made them: dedup with existing
# stores holds. (Old code: ("dict", 56) and deeper were refused; ("list", 200) too.)
_IDS = {("dict", 30): ("3b36ef61352e4321bf5d481463aad358", 60),
        ("dict", MAX_NEST - 1): ("17679ded0e07f389e2ff229acc33aa4d", 110),
        ("list", 57): ("b2b83dea12b6ea1e77dd3f6e9724bcbd", 3),
        ("list", 60): ("79560c3cfecb70528490737ac0e39c25", 3),
        ("tuple", 60): ("4a9a76a4e966ceefb6f021306d2faf21", 3)}


@pytest.mark.parametrize(("kind", "levels"), list(_IDS))
def test_node_ids_of_states_storable_before_do_not_change(kind: str, levels: int) -> None:
    state = deep(kind, levels)
    for built in (tree.build(state), tree.build(state, memo=tree.Memo())):
        digest = hashlib.blake2b(digest_size=16)
        for oid in sorted(built.objects):
            digest.update(oid.encode())
        assert (digest.hexdigest(), len(built.objects)) == _IDS[(kind, levels)]


def test_a_hostile_chain_past_the_load_depth_limit_is_a_format_error() -> None:
    """Nodes naming each other by Ref more than ``MAX_DEPTH`` levels deep, and one node whose
    value nests lists past msgpack's limit: FormatError (in a 1 MB thread stack, in a
    subprocess: a stack overflow would kill it)."""
    script = """
import threading
from cas_checkpoint import FormatError
from cas_checkpoint.format import codec
from cas_checkpoint.tree import build as tree
from cas_checkpoint.format.placeholders import Ref
from cas_checkpoint.format.objects import node_bytes, object_id
from cas_checkpoint.tree.shapes import MAX_DEPTH
VALUE = b"\\x00"
def chain(n):
    objects = {}
    top = node_bytes((VALUE, codec.encode("end")))
    for _ in range(n):
        objects[object_id(top)] = top
        top = node_bytes((VALUE, codec.encode_link(Ref(0))), [object_id(top)])
    objects[object_id(top)] = top
    return object_id(top), objects
deep_value = b"\\x91" * 1100 + b"\\xc0"  # 1,100 nested one-item lists around nil
cases = {"within": chain(MAX_DEPTH - 1), "past": chain(MAX_DEPTH + 100)}
one = node_bytes((VALUE, deep_value))
cases["one node"] = (object_id(one), {object_id(one): one})
out = {}
def run():
    for name, (root, objects) in cases.items():
        try:
            got = tree.load(root, lambda ids: {i: objects[i] for i in ids})
            out[name] = "loaded " + repr(got)
        except FormatError as exc:
            out[name] = "FormatError"
threading.stack_size(1 << 20)
t = threading.Thread(target=run)
t.start(); t.join()
print(out)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    got = eval(proc.stdout)  # noqa: S307 (our own subprocess's dict of str)
    assert got == {"within": "loaded 'end'", "past": "FormatError", "one node": "FormatError"}

