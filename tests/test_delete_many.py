"""``delete(thread_id, *checkpoint_ids)`` on both faces: several checkpoints leave a thread in one
compare-and-swap, entries saved meanwhile stay, and nothing changes when an id is not there."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from cas_checkpoint import CheckpointStore, ConflictError, InvalidArgumentError, NotFoundError
from cas_checkpoint.aio import AsyncCheckpointStore


def _state(i: int) -> dict[str, Any]:
    return {"messages": [f"message {k}" for k in range(i)]}


class Face:
    """One store over a folder, driven through the sync or the async face."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind = kind
        self.loop = asyncio.new_event_loop() if kind == "async" else None
        self.store: Any = (CheckpointStore.open(str(path)) if self.loop is None else
                           self.loop.run_until_complete(AsyncCheckpointStore.open(str(path))))

    def __call__(self, method: str, *args: Any, **kw: Any) -> Any:
        out = getattr(self.store, method)(*args, **kw)
        return out if self.loop is None else self.loop.run_until_complete(out)

    def close(self) -> None:
        if self.loop is not None:
            self.loop.run_until_complete(self.store.aclose())
            self.loop.close()


@pytest.fixture(params=["sync", "async"])
def face(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    f = Face(request.param, tmp_path / "store")
    yield f
    f.close()


def _ids(face: Face, thread: str) -> list[str]:
    return [i.id for i in face("history", thread)][::-1]  # oldest first


def _count_ref_writes(face: Face, monkeypatch: pytest.MonkeyPatch,
                      before: Any = None) -> list[str]:
    writes: list[str] = []
    backend = face.store.backend
    real = backend.write_ref

    def write_ref(key: str, data: bytes, expected: str | None, refresh: Any = None) -> str:
        writes.append(key)
        if before is not None and len(writes) == 1:
            before()
        return real(key, data, expected, refresh)

    monkeypatch.setattr(backend, "write_ref", write_ref)
    return writes


def test_several_checkpoints_go_in_one_compare_and_swap(
        face: Face, monkeypatch: pytest.MonkeyPatch) -> None:
    cps = [face("save", "t", _state(i)).id for i in range(8)]
    writes = _count_ref_writes(face, monkeypatch)
    face("delete", "t", cps[1], cps[4], cps[6])
    assert writes == [writes[0]]  # one ref write
    assert _ids(face, "t") == [c for k, c in enumerate(cps) if k not in (1, 4, 6)]
    assert face("head", "t") == cps[7]
    assert face("load", "t").state == _state(7)
    assert face("get", cps[4]).state == _state(4)  # objects stay until gc


def test_entries_saved_meanwhile_stay(face: Face, monkeypatch: pytest.MonkeyPatch,
                                      tmp_path: Path) -> None:
    """A save by another process lands between the delete's read of the log and its swap: the
    swap fails, the delete runs again on the new log, and the new checkpoint stays."""
    cps = [face("save", "t", _state(i)).id for i in range(5)]
    other = CheckpointStore.open(str(tmp_path / "store"))
    landed: list[str] = []
    writes = _count_ref_writes(
        face, monkeypatch, before=lambda: landed.append(other.save("t", _state(9)).id))
    face("delete", "t", cps[0], cps[2])
    assert len(writes) == 2  # the lost race and the retry
    assert _ids(face, "t") == [cps[1], cps[3], cps[4], landed[0]]
    assert face("load", "t").state == _state(9)


def test_a_removed_head_moves_to_its_nearest_ancestor_that_stays(face: Face) -> None:
    cps = [face("save", "t", _state(i)).id for i in range(4)]
    face("save", "side", _state(0))  # another thread is untouched
    face("delete", "t", cps[3], cps[2])
    assert face("head", "t") == cps[1] and face("load", "t").state == _state(1)
    face("delete", "t", *cps[:2])  # every checkpoint: the thread goes
    assert face("threads") == ["side"]


def test_nothing_changes_when_an_id_is_not_there(face: Face) -> None:
    cps = [face("save", "t", _state(i)).id for i in range(3)]
    elsewhere = face("save", "u", _state(5)).id
    with pytest.raises(NotFoundError, match="nothing was deleted") as err:
        face("delete", "t", cps[0], elsewhere)
    assert elsewhere in str(err.value)
    assert _ids(face, "t") == cps
    with pytest.raises(InvalidArgumentError, match=re.escape("delete(thread_id, checkpoint_id")):
        face("delete", "t")
    with pytest.raises(NotFoundError, match="does not exist"):
        face("delete", "nope", cps[0])
    with pytest.raises(ConflictError):
        face("delete", "t", cps[0], expected_head=cps[1])
    face("delete", "t", cps[0], cps[0], expected_head=cps[2])  # duplicates count once
    assert _ids(face, "t") == cps[1:]


def test_the_command_line_uses_only_the_public_api() -> None:
    """cas_checkpoint/cli is built on the public API: no store internals (``_core``, ``_run``,
    ``_edit``) and no ref-log editing of its own."""
    cli = Path(__file__).parent.parent / "cas_checkpoint" / "cli"
    private = re.compile(r"\._core\b|\._run\(|\._edit\b|\.rebuilt\(|refs\.entries\(")
    found = [f"{p.name}:{n}: {line.strip()}" for p in sorted(cli.glob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if private.search(line)]
    assert found == []
