"""Issue 27, items 1, 2 and 7: a save never records what a reader refuses (ARCHITECTURE.md,
invariant 11). Each test failed on the code before the fix: the save was acknowledged and
another process then got FormatError on the thread, or the save raised a raw UnicodeEncodeError.

Readers are fresh processes (``python -c``) reading the same local folder: the writing store
object never decodes what it wrote, so only another process sees what was really stored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest
from _hostile import files

import cas_checkpoint
from cas_checkpoint import (
    CasError,
    CheckpointStore,
    FormatError,
    InvalidArgumentError,
    SerializationError,
)
from cas_checkpoint.agents import Recorder
from cas_checkpoint.agents.tools import dispatch
from cas_checkpoint.engine import refs as refs_mod
from cas_checkpoint.format.objects import (
    MAX_LABEL,
    MAX_META_BYTES,
    MAX_META_DEPTH,
    MAX_PARENTS,
    MAX_REASON,
    MAX_TAG,
    MAX_TAGS,
    LogEntry,
)

ROOT = str(Path(cas_checkpoint.__file__).resolve().parent.parent)  # the package tested



READ = """
import json, sys
from datetime import timedelta
from cas_checkpoint import CheckpointStore
store = CheckpointStore.open(sys.argv[1])
out = {}
for t in sorted(store.threads()):
    cp = store.load(t)
    try:
        meta = repr(cp.metadata)
    except RecursionError:
        meta = "deep"
    store.save(t, {"second": "writer"})
    out[t] = {"label": cp.label, "tags": list(cp.tags), "meta": meta,
              "n": len(store.history(t))}  # (the second writer's save included)
store.gc(grace=timedelta(0))
assert store.verify(deep=True).ok
print(json.dumps(out))
"""


def read_elsewhere(root: str) -> dict[str, Any]:
    """What another process reads of every thread (and that it can save to each, gc, verify)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    got = subprocess.run([sys.executable, "-c", READ, root], capture_output=True, text=True,
                         env=env, timeout=120)
    assert got.returncode == 0, got.stderr[-2000:]
    out: dict[str, Any] = json.loads(got.stdout)
    return out


# --- 1. metadata a reader refuses: non-str keys at any depth, extension types, depth ------------


@pytest.mark.parametrize(("metadata", "path"), [
    ({"scores": {1: 0.5}}, "metadata['scores']"),
    ({"scores": {None: 0.5}}, "metadata['scores']"),
    ({"scores": {True: 0.5}}, "metadata['scores']"),
    ({"scores": {1.5: 0.5}}, "metadata['scores']"),
    ({"a": [{"b": {"c": {2: "x"}}}]}, "metadata['a'][0]['b']['c']"),
    ({"a": [1, {"b": msgpack.ExtType(1, b"x")}]}, "metadata['a'][1]['b']"),
    ({"a": msgpack.Timestamp(1, 0)}, "metadata['a']"),
    ({"args": (1, 2)}, "metadata['args']"),  # tuples stay refused
])
def test_metadata_a_reader_refuses_is_refused_before_anything_is_written(
        tmp_path: Path, metadata: dict[str, Any], path: str) -> None:
    root = str(tmp_path / "s")
    store = CheckpointStore.open(root)
    store.save("t", {"n": 0}, metadata={"ok": 1})
    before = files(root)
    with pytest.raises(SerializationError) as err:
        store.save("t", {"n": 1}, metadata=metadata)
    assert err.value.path == path
    assert path in str(err.value) and "str" in str(err.value)
    assert files(root) == before
    assert read_elsewhere(root)["t"]["n"] == 2  # its own save + the second writer's


def test_metadata_nesting_is_bounded(tmp_path: Path) -> None:
    """A reader's msgpack reads 1,024 levels, and a head holds metadata 3 levels deep: the
    writer accepted 1,021 levels no head could hold, and Python's own recursion (verify
    compares entries) failed far sooner. Metadata nests at most MAX_META_DEPTH levels."""
    root = str(tmp_path / "s")
    store = CheckpointStore.open(root)

    def nested(levels: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        inner = out
        for _ in range(levels - 1):
            inner["a"] = {}
            inner = inner["a"]
        return out

    store.save("deep", 1, metadata=nested(MAX_META_DEPTH))
    before = files(root)
    for levels in (MAX_META_DEPTH + 1, 1021, 1022, 5000):
        with pytest.raises(SerializationError, match="levels deep"):
            store.save("deeper", 1, metadata=nested(levels))
    loop: dict[str, Any] = {}
    loop["self"] = [loop]
    with pytest.raises(SerializationError, match="holds itself"):
        store.save("deeper", 1, metadata=loop)
    assert files(root) == before
    assert read_elsewhere(root)["deep"]["n"] == 2


def test_metadata_that_loads_elsewhere_is_kept_as_a_reader_decodes_it(tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    store = CheckpointStore.open(root)
    meta = {"scores": {"1": 0.5}, "raw": b"\x00", "inner": {b"k": [None, True, 1.5]}}
    info = store.save("t", 1, metadata=meta)
    assert info.metadata == meta
    assert read_elsewhere(root)["t"]["meta"] == repr(meta)


def test_recorder_tool_events_store_no_tool_arguments(tmp_path: Path) -> None:
    """The Recorder keeps only ``tool`` and ``ok`` of an event's details: tool arguments with
    int keys (or anything else) never reach the metadata."""
    root = str(tmp_path / "s")
    rec = Recorder(CheckpointStore.open(root), "run")
    info = rec.event("tool_call", {"n": 1}, tool="score\ud800", args={1: {None: 0.5}}, ok=True)
    assert info is not None and info.metadata == {"event": "tool_call",
                                                  "tool": "score\\ud800", "ok": True}
    assert read_elsewhere(root)["run"]["n"] == 2


# --- 2. labels, tags, parents and the head's size ---------------------------------------------


@pytest.mark.parametrize(("kw", "words"), [
    ({"label": "x" * (MAX_LABEL + 1)}, "label is"),
    ({"tags": ["t"] * (MAX_TAGS + 1)}, "tags has"),
    ({"tags": ["ok", "x" * (MAX_TAG + 1)]}, r"tags\[1\] is"),
    ({"status": "failed", "reason": "x" * (MAX_REASON + 1)}, "reason is"),
])
def test_labels_and_tags_are_bounded_on_save(tmp_path: Path, kw: dict[str, Any],
                                             words: str) -> None:
    root = str(tmp_path / "s")
    store = CheckpointStore.open(root)
    store.save("t", 0)
    before = files(root)
    with pytest.raises(InvalidArgumentError, match=words):
        store.save("t", 1, **kw)
    assert files(root) == before


def test_too_many_parents_are_refused(tmp_path: Path) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    cid = store.save("t", 0).id
    store._run(store._core.save("t", 1, parents=[cid] * MAX_PARENTS))
    with pytest.raises(InvalidArgumentError, match="parents names"):
        store._run(store._core.save("t", 2, parents=[cid] * (MAX_PARENTS + 1)))


@pytest.mark.parametrize("field", ["label", "tags", "tag", "parents"])
def test_labels_and_tags_past_their_bounds_do_not_decode(field: str) -> None:
    label = "x" * (MAX_LABEL + 1) if field == "label" else None
    tags = (["t"] * (MAX_TAGS + 1) if field == "tags"
            else ["x" * (MAX_TAG + 1)] if field == "tag" else [])
    parents = [b"\x01" * 32] * (MAX_PARENTS + 1 if field == "parents" else 1)
    raw = [b"\x00" * 32, parents, 1, 0.0, 0, label, tags, {}]
    with pytest.raises(FormatError):
        LogEntry.unpack(raw)


def test_a_full_head_at_every_bound_loads_lists_and_saves_elsewhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four saves with a 1 MB label (or three with 200,000 tags) made a head over the 4 MB a
    reader accepts. Now each entry is bounded: a thread (with a 64 KB id) whose every entry is
    at every bound, in 4-byte UTF-8 characters, has heads of at most ~2.3 MB, and stays
    readable by another process, which can save to it."""
    root = str(tmp_path / "s")
    store = CheckpointStore.open(root)
    sizes: list[int] = []
    real = refs_mod.check_size
    monkeypatch.setattr(refs_mod, "check_size",
                        lambda t, data: (sizes.append(len(data)), real(t, data))[1])
    wide = "\U0001f600"  # 4 bytes in UTF-8
    meta = {"m": wide * ((MAX_META_BYTES - 64) // 4)}
    kw: dict[str, Any] = {"label": wide * MAX_LABEL, "tags": [wide * MAX_TAG] * MAX_TAGS,
                          "metadata": meta, "status": "failed", "reason": wide * MAX_REASON}
    thread = wide * (refs_mod.MAX_THREAD_ID_BYTES // 4)
    for i in range(17):  # past a full tail (15 entries) and a first log segment
        store.save(thread, {"i": i}, **kw)
    assert 2_000_000 < max(sizes) < refs_mod.MAX_HEAD_BYTES - refs_mod.HEAD_ROOM
    got = read_elsewhere(root)[thread]
    assert got["n"] == 18 and got["label"] == wide * MAX_LABEL and len(got["tags"]) == MAX_TAGS


def test_a_head_over_the_readers_limit_is_never_written(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The last guard, whatever the inputs: a head that encodes past what readers accept is
    refused before the ref is written (made reachable here by lowering the limit)."""
    root = str(tmp_path / "s")
    store = CheckpointStore.open(root)
    store.save("t", 0)
    ref_files = {k: v for k, v in files(root).items() if k.startswith("refs")}
    monkeypatch.setattr(refs_mod, "MAX_HEAD_BYTES", 40_000, raising=False)
    monkeypatch.setattr(refs_mod, "HEAD_ROOM", 0, raising=False)
    with pytest.raises(InvalidArgumentError, match="nothing was saved"):
        store.save("t", 1, metadata={"m": "x" * 50_000})
    assert {k: v for k, v in files(root).items() if k.startswith("refs")} == ref_files
    monkeypatch.undo()
    assert read_elsewhere(root)["t"]["n"] == 2


# --- 7. lone surrogates: an InvalidArgumentError that names the argument ---------------------


@pytest.mark.parametrize(("kw", "words"), [
    ({"label": "a\ud800"}, "label holds a lone surrogate"),
    ({"tags": ["ok", "\udfff"]}, r"tags\[1\] holds a lone surrogate"),
    ({"status": "halted", "reason": "x\ud800y"}, "reason holds a lone surrogate"),
    ({"metadata": {"a": ["\ud800"]}}, r"metadata\['a'\]\[0\] holds a lone surrogate"),
    ({"metadata": {"a": {"\ud800": 1}}}, r"metadata\['a'\] has a key that holds"),
])
def test_lone_surrogates_are_a_cas_error_naming_the_argument(tmp_path: Path, kw: dict[str, Any],
                                                             words: str) -> None:
    root = str(tmp_path / "s")
    store = CheckpointStore.open(root)
    store.save("t", 0)
    before = files(root)
    with pytest.raises(CasError, match=words):
        store.save("t", 1, **kw)
    with pytest.raises(InvalidArgumentError, match="thread id"):
        store.save("t\ud800", 1)
    assert files(root) == before


@pytest.mark.parametrize("arguments", [
    '{"label": "a\\ud800"}', '{"note": "\\udc00"}', {"label": "\ud800"},
])
def test_tool_dispatch_refuses_lone_surrogates_like_other_bad_arguments(
        tmp_path: Path, arguments: object) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.save("t", {"a": 1})
    with pytest.raises(InvalidArgumentError, match="create_checkpoint: argument '(label|note)' "
                       "holds a lone surrogate"):
        dispatch(store, "t", "create_checkpoint", arguments)
    with pytest.raises(InvalidArgumentError, match="argument 'query'"):
        dispatch(store, "t", "search_checkpoints", '{"query": "\\ud800"}')
    assert len(store.history("t")) == 1


def test_a_recovery_checkpoint_keeps_an_error_message_with_a_lone_surrogate(
        tmp_path: Path) -> None:
    root = str(tmp_path / "s")
    rec = Recorder(CheckpointStore.open(root), "run")
    with pytest.raises(OSError), rec.before("open_file", {"n": 1}) as op:
        raise OSError("cannot open b'\\xff' as 'f\udcff'")
    assert op.recovery is not None and op.recovery.reason is not None
    assert "f\\udcff" in op.recovery.reason
    assert read_elsewhere(root)["run"]["n"] == 3
