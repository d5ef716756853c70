"""A long-lived writer whose memory of a thread went stale while another process pruned,
repacked and collected it: its next save recovers by itself (re-reads the ref, redoes the
change), and no message claims damage that is not there (issue 27, item 6)."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest

from cas_checkpoint import CheckpointStore
from cas_checkpoint.engine.object_store import pack_key
from cas_checkpoint.errors import NotFoundError
from tests.conftest import open_store

# A writer that keeps no pack in memory (``cache_bytes=0``: one pack at most) is the writer
# whose LRU has let go of the packs it wrote, as a long-lived process with many threads does.
TINY_CACHE = 0


def _big(i: int) -> dict[str, Any]:
    """A state that goes into packs (30 messages of ~200 bytes), its root in its record."""
    return {"i": i, "messages": [f"message {i}-{k} " * 10 for k in range(30)]}


def _maintain(store: CheckpointStore) -> None:
    """What an operator's maintenance run does to the thread: keep only its newest checkpoint,
    rewrite its packs without the rest, and collect the old packs at once."""
    assert store.prune("t", keep_last=1).removed
    assert any(t.repacked for t in store.repack("t", min_garbage=0).threads)
    assert store.gc(grace=timedelta(0)).deleted


def _check_readable(url: str, acked: list[str], new: list[str]) -> None:
    """A fresh reader: every checkpoint the thread still lists loads, the saves made after the
    maintenance are among them, and a deep verify finds nothing."""
    fresh = CheckpointStore.open(url)
    listed = [c.id for c in fresh.history("t")]
    assert set(new) <= set(listed)
    assert acked[-1] in listed  # the one prune kept
    for cid in listed:
        assert fresh.load("t", cid).id == cid
        assert fresh.get(cid).id == cid
    assert fresh.load("t").id == new[-1]
    report = fresh.verify()
    assert report.ok, report.to_text()


@pytest.mark.parametrize("kind", ["local", "memory", "local-async"])
@pytest.mark.parametrize("saves", [3, 7])  # a new pack beside the old ones; one merged with them
def test_a_writer_idle_while_another_prunes_repacks_and_collects_saves_again(
        kind: str, saves: int, tmp_path: Any, request: pytest.FixtureRequest) -> None:
    a = open_store(kind, tmp_path, request, cache_bytes=TINY_CACHE)
    acked = [a.save("t", _big(i)).id for i in range(saves)]
    assert len(a.refs.read("t").head.packs) >= 2  # type: ignore[union-attr]
    _maintain(CheckpointStore.open(a.url))
    # (the old code: NotFoundError "pack ... is missing ...; run cas-checkpoint verify")
    new = [a.save("t", _big(100 + j)).id for j in range(3)]
    _check_readable(a.url, acked, new)


_MAINTAIN = """
import sys
from datetime import timedelta
from cas_checkpoint import CheckpointStore
b = CheckpointStore.open(sys.argv[1])
assert b.prune("t", keep_last=1).removed
assert any(t.repacked for t in b.repack("t", min_garbage=0).threads)
assert b.gc(grace=timedelta(0)).deleted
print("done")
"""


def test_maintenance_by_another_process_does_not_break_a_writers_next_save(
        tmp_path: Any) -> None:
    url = str(tmp_path / "s")
    a = CheckpointStore.open(url, cache_bytes=TINY_CACHE)
    acked = [a.save("t", _big(i)).id for i in range(7)]
    out = subprocess.run([sys.executable, "-c", _MAINTAIN, url], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr
    new = [a.save("t", _big(100 + j)).id for j in range(3)]
    _check_readable(url, acked, new)


def test_a_pack_the_current_ref_names_that_is_missing_is_still_reported(tmp_path: Any) -> None:
    """The retry is for a ref that moved: when the ref as it is now names a missing pack, the
    save raises NotFoundError naming it (and says to run verify), and writes no ref."""
    url = str(tmp_path / "s")
    a = CheckpointStore.open(url, cache_bytes=TINY_CACHE)
    for i in range(3):
        a.save("t", _big(i))
    ref = a.refs.read("t")
    assert ref is not None and len(ref.head.packs) == 3
    gone = ref.head.packs[0].id
    a.backend.delete_many([pack_key(gone)])
    with pytest.raises(NotFoundError) as err:
        a.save("t", _big(3))  # the fourth level-0 pack: merged with the three
    assert pack_key(gone) in str(err.value) and "verify" in str(err.value)
    after = a.refs.read("t")
    assert after is not None and after.version == ref.version


def test_a_load_on_a_ref_that_keeps_moving_does_not_claim_damage(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read of the ref finds a new version naming packs that are gone: the load gives up
    after its retries with a StorageError that says nothing is damaged (the old code raised
    "pack ... is missing ...; run verify"); a ref that stays the same is reported damaged."""
    from cas_checkpoint.engine.refs import Ref
    from cas_checkpoint.errors import StorageError

    url = str(tmp_path / "s")
    a = CheckpointStore.open(url)
    for i in range(3):
        a.save("t", _big(i))
    ref = a.refs.read("t")
    assert ref is not None
    a.backend.delete_many([pack_key(p.id) for p in ref.head.packs])
    fresh = CheckpointStore.open(url)
    with pytest.raises(NotFoundError, match="is missing"):
        fresh.load("t")
    reads = iter(range(10**6))
    core_refs = fresh._core.refs
    real = core_refs.read

    def moving(thread_id: str) -> Any:
        got = yield from real(thread_id)
        return None if got is None else Ref(got.head, f"{got.version}-{next(reads)}")

    monkeypatch.setattr(core_refs, "read", moving)
    with pytest.raises(StorageError, match="nothing is damaged") as err:
        fresh.load("t")
    assert "verify" not in str(err.value)
