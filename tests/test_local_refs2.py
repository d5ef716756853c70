"""Local refs, second round (issue 27): a damaged first sector does not make a slotted ref look
like a ref in one piece; a writer killed between its flush and its retire cannot lead readers
to step back silently to the older head; lock files hold nothing and go with their thread; a
damaged ref has a way forward (verify says what each slot holds, ``repair-ref`` fixes it)."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import blake3
import pytest
from builders import run_cli_proc

from cas_checkpoint import CheckpointStore, IntegrityError
from cas_checkpoint.backends import ref_slots
from cas_checkpoint.engine.refs import thread_key


def _path(store: CheckpointStore, thread: str) -> str:
    return os.path.join(store.url, *thread_key(thread).split("/"))


def _zero(path: str, at: int, n: int = 512) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(bytes(n))


def _reading(path: str) -> ref_slots.Reading:
    return ref_slots.read(Path(path).read_bytes())


def test_a_zeroed_first_sector_of_slot_0_reads_slot_1_and_a_save_repairs(
        tmp_path: Path) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    first = store.save("t", {"a": 1})
    second = store.save("t", {"a": 2})
    path = _path(store, "t")
    assert ref_slots.live(Path(path).read_bytes()).index == 1  # type: ignore[union-attr]
    _zero(path, 0)  # slot 0's first sector (the retired slot)
    fresh = CheckpointStore.open(store.url)
    assert fresh.head("t") == second.id  # not taken for a ref in one piece
    assert fresh.load("t").state == {"a": 2}
    reading = _reading(path)
    assert reading.damaged and "slot 0: damaged (zeroed first sector" in reading.describe()
    third = fresh.save("t", {"a": 3})  # writes slot 0 whole again
    reading = _reading(path)
    assert reading.settled and not reading.damaged and reading.live.index == 0  # type: ignore[union-attr]
    assert [h.id for h in CheckpointStore.open(store.url).history("t")] == [
        third.id, second.id, first.id]


def _format1_file(seq: int, head: bytes) -> bytes:
    """A slotted file as the first slotted version wrote it (format 1, slot 1 all zeros)."""
    header = struct.Struct(">4sBQI32s")
    hasher = blake3.blake3(header.pack(b"CASR", 1, seq, len(head), b"")[:17])
    hasher.update(head)
    first = header.pack(b"CASR", 1, seq, len(head), hasher.digest()) + head
    slot = ref_slots.slot_size(len(head))
    return first + bytes(2 * slot - len(first))


def test_format_1_slotted_refs_still_read_and_are_rewritten_in_format_2(tmp_path: Path) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    first = store.save("t", {"a": 1})
    path = _path(store, "t")
    live = _reading(path).live
    assert live is not None
    Path(path).write_bytes(_format1_file(live.seq, live.head))
    fresh = CheckpointStore.open(store.url)
    assert fresh.head("t") == first.id
    assert _reading(path).settled  # slot 1 all zeros is how format 1 made new files
    fresh.save("t", {"a": 2})
    live = _reading(path).live
    assert live is not None and live.fmt == 2


_KILLED_AFTER_FLUSH = r"""
import sys, time
import cas_checkpoint.backends.local as local
from cas_checkpoint import CheckpointStore
store = CheckpointStore.open(sys.argv[1])
real = local._datasync
def stop(fd):
    real(fd)
    print("flushed", flush=True)
    time.sleep(600)  # killed here: after the flush, before the retire
local._datasync = stop
store.save("t", {"a": 3})
"""


def _killed_between_flush_and_retire(tmp_path: Path) -> tuple[CheckpointStore, str, str]:
    """A store whose ref has two valid slots: a writer flushed its new slot and was killed
    (SIGKILL) before it retired the old one. Returns (store, path, head id of that save)."""
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.save("t", {"a": 1})
    store.save("t", {"a": 2})
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_AFTER_FLUSH, store.url],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "flushed"
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    path = _path(store, "t")
    fresh = CheckpointStore.open(store.url)
    head = fresh.head("t")
    assert fresh.load("t").state == {"a": 3}  # the newer slot (the save was flushed)
    assert head is not None
    return fresh, path, head


def test_a_lost_retire_leaves_two_valid_slots(tmp_path: Path) -> None:
    _store, path, _head = _killed_between_flush_and_retire(tmp_path)
    reading = _reading(path)
    assert [s.state for s in reading.slots] == ["valid", "valid"] and not reading.settled


@pytest.mark.parametrize("damage", ["flipped_byte", "zeroed_sector"])
def test_a_damaged_newest_slot_after_a_lost_retire_is_an_error_not_a_step_back(
        tmp_path: Path, damage: str) -> None:
    store, path, _head = _killed_between_flush_and_retire(tmp_path)
    live = ref_slots.live(Path(path).read_bytes())
    assert live is not None
    at = live.index * live.slot
    if damage == "flipped_byte":
        with open(path, "r+b") as f:
            f.seek(at + ref_slots.HEADER + 5)
            byte = f.read(1)
            f.seek(at + ref_slots.HEADER + 5)
            f.write(bytes([byte[0] ^ 1]))
    else:
        _zero(path, at)
    with pytest.raises(IntegrityError, match="newer head"):
        CheckpointStore.open(store.url).load("t")
    with pytest.raises(IntegrityError, match="repair-ref"):  # and a writer writes nothing
        CheckpointStore.open(store.url).save("t", {"a": 4})


def test_a_save_after_a_lost_retire_settles_the_ref(tmp_path: Path) -> None:
    store, path, head = _killed_between_flush_and_retire(tmp_path)
    new = store.save("t", {"a": 4})
    reading = _reading(path)
    assert reading.settled and [s.state for s in reading.slots].count("valid") == 1
    assert [h.id for h in store.history("t")][:2] == [new.id, head]


def test_a_torn_newer_slot_without_a_successor_mark_still_reads_the_older_head(
        tmp_path: Path) -> None:
    """A writer killed in the middle of its slot write (before the mark): not acknowledged,
    so the older head is the head, as before."""
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.save("t", {"a": 1})
    second = store.save("t", {"a": 2})
    path = _path(store, "t")
    data = bytearray(Path(path).read_bytes())
    live = ref_slots.live(bytes(data))
    assert live is not None
    torn = ref_slots.encode_slot(live.seq + 1, b"CASH" + os.urandom(500))[:300]
    at = (1 - live.index) * live.slot
    data[at:at + len(torn)] = torn
    Path(path).write_bytes(bytes(data))
    assert CheckpointStore.open(store.url).head("t") == second.id


# --- lock files ------------------------------------------------------------------------------


def test_lock_files_hold_nothing_and_go_with_their_thread(tmp_path: Path) -> None:
    from cas_checkpoint import Key

    for key in (None, Key.generate()):
        root = tmp_path / ("e" if key else "p")
        store = CheckpointStore.open(str(root), encryption=key)
        store.save("patient-42", {"a": 1})
        store.save("patient-42", {"a": 2})
        locks = list((root / "refs" / "heads").glob("*.lock"))
        assert len(locks) == 1 and locks[0].read_bytes() == b""  # no pid, no host name
        store.delete_thread("patient-42")
        assert list((root / "refs" / "heads").iterdir()) == []
        store.save("patient-42", {"a": 3})  # the thread can be made again
        assert store.load("patient-42").state == {"a": 3}


# --- the way forward: verify names each slot, gc names the thread and the command ----------


def test_verify_says_what_each_slot_holds(tmp_path: Path) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.save("t", {"a": 1})
    second = store.save("t", {"a": 2})
    _zero(_path(store, "t"), 0)
    report = CheckpointStore.open(store.url).verify()
    assert not report.ok and [p.kind for p in report.problems] == ["corrupt"]
    detail = report.problems[0].detail
    assert "slot 0: damaged (zeroed first sector" in detail
    assert f"slot 1: head {second.id}, whole" in detail and "--use-slot 1" in detail


def test_verify_notes_two_valid_slots(tmp_path: Path) -> None:
    store, _path_, head = _killed_between_flush_and_retire(tmp_path)
    report = store.verify()
    assert report.ok and len(report.notes) == 1  # not damage, but said
    assert f"head {head}, whole" in report.notes[0]
    assert "retiring the older" in report.notes[0]


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return run_cli_proc(*argv)


def test_an_unreadable_ref_stops_gc_naming_the_thread_and_repair_ref_is_the_way_forward(
        tmp_path: Path) -> None:
    store, path, head = _killed_between_flush_and_retire(tmp_path)
    store.save("other", {"b": 1})
    live = ref_slots.live(Path(path).read_bytes())
    assert live is not None
    _zero(path, live.index * live.slot)  # the newest slot: reads must raise
    with pytest.raises(IntegrityError) as caught:
        CheckpointStore.open(store.url).gc()
    message = str(caught.value)
    assert "gc stopped before deleting anything" in message and "'t'" in message
    assert "cas-checkpoint repair-ref STORE 't' --use-slot N" in message
    report = CheckpointStore.open(store.url).verify()
    assert any("newer head" in p.detail and "slot" in p.detail for p in report.problems)

    asked = _cli("repair-ref", store.url, "t", "--use-slot", str(1 - live.index))
    assert asked.returncode == 2 and "--yes" in asked.stderr and "whole" in asked.stderr
    with pytest.raises(IntegrityError):  # nothing was changed without --yes
        CheckpointStore.open(store.url).load("t")
    done = _cli("repair-ref", store.url, "t", "--use-slot", str(1 - live.index), "--yes")
    assert done.returncode == 0, done.stderr
    fresh = CheckpointStore.open(store.url)
    assert fresh.load("t").state == {"a": 2}  # the older head, chosen by the operator
    assert fresh.gc().threads == 2 and fresh.verify().ok

    _zero(path, 0, os.path.getsize(path))  # nothing left to keep: remove it
    removed = _cli("repair-ref", store.url, "t", "--remove", "--yes")
    assert removed.returncode == 0, removed.stderr
    fresh = CheckpointStore.open(store.url)
    assert fresh.threads() == ["other"] and fresh.gc().threads == 1
