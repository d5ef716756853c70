"""A store object that resumes a thread it did not save (a new process: load the head, append
a message, save): the save checks only what it asks about in the loaded packs (not every object
of the thread's packs), sees what the caller changed in place, and the next load is warm. (Its
build cuts the state from scratch: it has no memory of a state it did not build; a state of
~1,000 messages is a few dozen nodes.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cas_checkpoint import CheckpointStore
from cas_checkpoint.engine import pack_reads, process_caches
from cas_checkpoint.tree import build as tree


def _message(i: int) -> dict[str, Any]:
    return {"role": "user" if i % 2 else "assistant", "content": f"message {i} " + "x" * 300,
            "id": i}


class Hashes:
    """Objects hashed by the object store (reads) and by ``tree.build`` (nodes), counted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.read = self.built = 0
        one, many, build = pack_reads.object_id, pack_reads.object_ids, tree.object_id

        def read_one(data: Any) -> Any:
            self.read += 1
            return one(data)

        def read_many(datas: Any) -> Any:
            datas = list(datas)
            self.read += len(datas)
            return many(datas)

        def built(data: Any) -> Any:
            self.built += 1
            return build(data)

        monkeypatch.setattr(pack_reads, "object_id", read_one)
        monkeypatch.setattr(pack_reads, "object_ids", read_many)
        monkeypatch.setattr(tree, "object_id", built)

    def reset(self) -> None:
        self.read = self.built = 0


@pytest.fixture
def hashes(monkeypatch: pytest.MonkeyPatch) -> Iterator[Hashes]:
    yield Hashes(monkeypatch)


def _written(tmp_path: Path, n: int) -> str:
    root = str(tmp_path / "s")
    CheckpointStore.open(root).save("t", {"messages": [_message(i) for i in range(n)]})
    return root


def test_a_save_after_a_cold_load_hashes_only_what_it_asks_about(tmp_path: Path,
                                                                 hashes: Hashes) -> None:
    root = _written(tmp_path, 300)
    store = CheckpointStore.open(root)
    state = store.load("t").state
    state["messages"].append(_message(300))
    hashes.reset()
    store.save("t", state)
    assert hashes.read < 10  # (the old code hashed every object of the thread's pack: ~400)
    # the build hashes each node of the state once, as a build from scratch does
    assert 0 < hashes.built <= len(tree.build(state).objects) + 1
    assert CheckpointStore.open(root).load("t").state == state


def test_a_save_after_a_cold_load_sees_what_the_caller_changed(tmp_path: Path) -> None:
    root = _written(tmp_path, 120)
    store = CheckpointStore.open(root)
    state = store.load("t").state
    state["messages"][7]["content"] = "changed in place"  # (the same dict object)
    del state["messages"][50]
    state["messages"].append(_message(120))
    saved = store.save("t", state)
    assert store.load("t").state == state  # (warm: the save's own encoding)
    again = CheckpointStore.open(root).load("t")
    assert again.id == saved.id and again.state == state
    assert again.state["messages"][7]["content"] == "changed in place"


def test_a_warm_load_after_a_cold_one_gives_a_fresh_copy(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    root = _written(tmp_path, 200)
    process_caches.clear()  # (as if another process had saved it: a cold load first)
    store = CheckpointStore.open(root)
    joined = []
    join = tree.load
    monkeypatch.setattr(tree, "load", lambda *a, **k: joined.append(a[0]) or join(*a, **k))
    first = store.load("t").state
    first["messages"].clear()
    second = store.load("t").state  # from the encoding kept by the first: not joined again
    assert len(joined) == 1 and len(second["messages"]) == 200
    assert second == CheckpointStore.open(root).load("t").state
