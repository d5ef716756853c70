"""What a new store costs on local disk before its first save is acknowledged: the flushes,
files and folders of a fresh store's first saves (LangGraph's own tests open a new store for
each test, so these fixed costs are most of what a test pays beyond memory://)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

import cas_checkpoint.backends.local as local
from cas_checkpoint import CheckpointStore

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="names flushed files through /proc/self/fd")


def _spy(monkeypatch: pytest.MonkeyPatch, root: str) -> list[tuple[str, str]]:
    """Every flush and folder made from now on, in order: ("file" | "folder" | "data",
    path relative to ``root``) for fsync of a file, of a folder, fdatasync; ("mkdir", path)."""
    events: list[tuple[str, str]] = []

    def rel(path: str) -> str:
        return os.path.relpath(path, root)

    def fsync(fd: int) -> None:
        kind = "folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        events.append((kind, rel(os.readlink(f"/proc/self/fd/{fd}"))))
        real_fsync(fd)

    def fdatasync(fd: int) -> None:
        events.append(("data", rel(os.readlink(f"/proc/self/fd/{fd}"))))
        real_datasync(fd)

    def mkdir(path: Any, *a: Any, **k: Any) -> None:
        real_mkdir(path, *a, **k)
        events.append(("mkdir", rel(os.fspath(path))))

    real_fsync, real_datasync, real_mkdir = os.fsync, local._datasync, os.mkdir
    monkeypatch.setattr(local.os, "fsync", fsync)
    monkeypatch.setattr(local, "_datasync", fdatasync)
    monkeypatch.setattr(os, "mkdir", mkdir)
    return events


def test_a_fresh_stores_first_save_flushes_each_folder_once_after_the_folders_are_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new store (an empty folder, as a test's temporary folder is) and a small state (no
    pack): the settings object and the thread's ref, each a temp file flushed and linked, and
    the folders refs/ and refs/heads/ made before the first flush, so that the file's flush
    commits them too; then the root, refs/ and refs/heads/ flushed once each: 5 flushes.
    Old code: 6, the root flushed twice (once for the settings object, once for refs/,
    made after it), and refs/ flushed before the ref's own file (a journal commit of its own)."""
    root = str(tmp_path / "store")
    os.mkdir(root)
    store = CheckpointStore.open(root)
    events = _spy(monkeypatch, root)
    store.save("t", {"a": 1})
    flushes = [e for e in events if e[0] != "mkdir"]
    folders = [p for kind, p in flushes if kind == "folder"]
    assert sorted(folders) == sorted([".", "refs", os.path.join("refs", "heads")]), events
    assert len(flushes) == 5, events
    made = [p for kind, p in events if kind == "mkdir"]
    assert made == ["refs", os.path.join("refs", "heads")], events  # and no packs/ folder
    first_file = next(i for i, e in enumerate(events) if e[0] == "file")
    assert all(i < first_file for i, e in enumerate(events) if e[0] == "mkdir"), events
    # what the store holds: its settings object, the ref and its lock file, in two folders
    files = sorted(os.path.relpath(os.path.join(d, f), root)
                   for d, _dirs, names in os.walk(root) for f in names)
    assert [f for f in files if not f.startswith("refs")] == ["cas-store"]
    assert len(files) == 3, files

    events.clear()
    store.save("t", {"a": 2})  # a steady save: one fdatasync of the ref, nothing else
    assert [e[0] for e in events] == ["data"], events


def test_a_second_thread_flushes_its_ref_and_its_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new thread in a store this object has written: its ref (temp file, then refs/heads/);
    no folder above refs/heads/ again."""
    root = str(tmp_path / "store")
    store = CheckpointStore.open(root)
    store.save("t", {"a": 1})
    events = _spy(monkeypatch, root)
    store.save("u", {"a": 1})
    assert [e[0] for e in events] == ["file", "folder"], events
    assert events[1][1] == os.path.join("refs", "heads")


def test_another_store_object_flushes_the_folders_it_did_not_make_before_it_returns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store object that finds the folders made (by another process, which may have died
    before flushing them) flushes refs/heads/'s and refs/' parents once, after its ref's own
    flush and before the save returns."""
    root = str(tmp_path / "store")
    CheckpointStore.open(root).save("t", {"a": 1})
    other = CheckpointStore.open(root)
    events = _spy(monkeypatch, root)
    other.save("t", {"a": 2})
    assert events[0][0] == "data", events
    assert sorted(p for kind, p in events if kind == "folder") == [".", "refs"], events
    assert not [e for e in events if e[0] == "mkdir"], events


def test_a_langgraph_tests_fresh_saver_flushes_five_times_then_once_a_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What LangGraph's own tests do with each new saver (compat/lg_fixtures.py: a new
    temporary folder, ``CasSaver.from_url``): the first ``put`` flushes 5 times (the settings
    object and its root, refs/, the new ref and refs/heads/), and each ``put_writes`` and
    ``put`` after it once. Old code: 6 for the first put."""
    pytest.importorskip("langgraph")
    from langgraph.checkpoint.base import empty_checkpoint

    from cas_checkpoint.integrations.langgraph import CasSaver

    root = str(tmp_path / "lgsuite")
    os.mkdir(root)
    saver = CasSaver.from_url(root)
    events = _spy(monkeypatch, root)
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    got = saver.put(config, empty_checkpoint(), {"source": "input", "step": -1}, {})
    assert len([e for e in events if e[0] != "mkdir"]) == 5, events
    events.clear()
    saver.put_writes(got, [("a", 1)], "task-1")
    got = saver.put(got, empty_checkpoint(), {"source": "loop", "step": 0}, {})
    assert [e[0] for e in events] == ["data", "data"], events
