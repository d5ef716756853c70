"""Issue 27, found in review of the second hardening round: what a reader accepts is bounded as
tightly as what a writer writes, so hostile bytes meet a ``CasError``, never a RecursionError
in the code that compares, copies or prints what was decoded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import cas_checkpoint
from cas_checkpoint import CheckpointStore, FormatError
from cas_checkpoint.engine import model as model_mod
from cas_checkpoint.format.objects import MAX_META_DEPTH, LogEntry

ROOT = str(Path(cas_checkpoint.__file__).resolve().parent.parent)


def nested(levels: int, leaf: Any = None) -> dict[str, Any]:
    """A dict holding ``levels - 1`` dicts inside each other (``levels`` dicts in all)."""
    out: dict[str, Any] = {}
    inner = out
    for _ in range(levels - 1):
        inner["a"] = {}
        inner = inner["a"]
    if leaf is not None:
        inner["leaf"] = leaf
    return out


@pytest.mark.parametrize("levels", [MAX_META_DEPTH + 1, 200, 1000])
def test_a_log_entry_with_metadata_nested_past_the_bound_does_not_decode(levels: int) -> None:
    raw = [b"\x00" * 32, [b"\x01" * 32], 1, 0.0, 0, None, [], nested(levels)]
    with pytest.raises(FormatError, match=f"at most {MAX_META_DEPTH} levels"):
        LogEntry.unpack(raw)


@pytest.mark.parametrize("meta", [nested(MAX_META_DEPTH), nested(MAX_META_DEPTH - 3, [1, [2]]),
                                  {"a": [[[]]], "b": 1}, {}])
def test_what_a_save_accepts_a_log_entry_decodes(meta: dict[str, Any]) -> None:
    checked = model_mod.check_meta(None, [], meta)[2]  # the writer's own check passes
    raw = [b"\x00" * 32, [b"\x01" * 32], 1, 0.0, 0, None, [], checked]
    assert LogEntry.unpack(raw).metadata == checked


READ = """
import sys
from cas_checkpoint import CheckpointStore, CasError
store = CheckpointStore.open(sys.argv[1])
try:
    store.load("t")
except CasError as exc:
    print("load:", type(exc).__name__)
report = store.verify(deep=True)
print("verify ok:", report.ok, [p.kind for p in report.problems])
"""


def test_a_head_with_hostile_deep_metadata_is_a_cas_error_for_load_and_verify(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Metadata 1,000 levels deep decodes with msgpack (1,024 levels), and verify's comparison
    of entries then raised RecursionError. The head is written here by a writer whose depth
    check is turned off (a hostile or buggy writer); another process must get CasErrors."""
    root = str(tmp_path / "s")
    store = CheckpointStore.open(root)
    store.save("t", {"n": 0})
    monkeypatch.setattr(model_mod, "_meta_problem", lambda metadata: None)
    store.save("t", {"n": 1}, metadata=nested(1000))
    got = subprocess.run([sys.executable, "-c", READ, root], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
    assert got.returncode == 0, got.stderr[-2000:]
    assert "load: FormatError" in got.stdout
    assert "verify ok: False" in got.stdout


def test_a_record_at_every_bound_is_within_what_a_reader_reads() -> None:
    from cas_checkpoint.engine.refs import MAX_THREAD_ID_BYTES
    from cas_checkpoint.format.objects import (
        MAX_LABEL,
        MAX_META_BYTES,
        MAX_PARENTS,
        MAX_REASON,
        MAX_RECORD_BYTES,
        MAX_TAG,
        MAX_TAGS,
        CheckpointId,
        ObjectId,
        Record,
    )

    wide = "\U0001d11e"  # four bytes of UTF-8
    record = Record(wide * (MAX_THREAD_ID_BYTES // 4),
                    tuple(CheckpointId(f"{i:064x}") for i in range(MAX_PARENTS)),
                    ObjectId("ab" * 32), 1, 0.0, 0, wide * MAX_LABEL,
                    tuple(wide * MAX_TAG for _ in range(MAX_TAGS)),
                    {"k": "x" * (MAX_META_BYTES - 16)}, None, "failed", None, wide * MAX_REASON)
    data = record.encode()
    assert len(data) <= MAX_RECORD_BYTES
    assert Record.decode(data) == record


def test_a_hostile_record_is_refused_by_its_size_before_it_is_decoded() -> None:
    """A bundle's records are hashed to ids its log names, but the sender chooses both: a
    record of 4 MB of empty maps grew the reader by ~256 MB before its FormatError."""
    import tracemalloc

    from cas_checkpoint.format.objects import _HEADERS, RECORD, Record

    body = b"\xdd" + (1 << 22).to_bytes(4, "big") + b"\x80" * (1 << 22)  # 4M empty maps
    data = _HEADERS[RECORD] + body
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match="at most"):
            Record.decode(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
