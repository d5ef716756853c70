"""Issue 27's property: whatever a save is given, it either raises a CasError before anything is
written, or every other process reads back exactly what was saved (load, history, find by label,
tag and metadata), gc and verify run clean, and a second writer can save to the thread.

Save arguments cover the documented value model for states, metadata of any JSON-like shape with
keys of every type (str, int, None, bool, float, bytes, nested), labels and tags of any length
and content (lone surrogates included), and odd thread ids. Each hypothesis example is a batch of
saves to one local folder, read back by one fresh process (``python -c``): the writing store
object never decodes what it wrote, so only another process sees what was stored. Examples:
``CAS_SOAK=small`` (CI) or ``full``."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

from _hostile import files
from _soak import soak
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cas_checkpoint
from cas_checkpoint import CasError, CheckpointStore

ROOT = str(Path(cas_checkpoint.__file__).resolve().parent.parent)  # the package tested

ANY_CHAR = st.characters(exclude_categories=())  # lone surrogates included
ODD = st.sampled_from(["\ud800", "x\udcff", "\udfff\ud800", "", " ", "é", "\x00", "\U0001f600"])
TEXT = st.text(max_size=12) | ODD | st.text(ANY_CHAR, max_size=12)


def _long(piece: str, times: int) -> str:
    return piece * times


LONG_TEXT = st.builds(_long, st.text(ANY_CHAR, min_size=1, max_size=2), st.integers(0, 1100))
LABEL = st.none() | TEXT | LONG_TEXT
TAGS = (st.lists(TEXT | LONG_TEXT, max_size=3)
        | st.builds(lambda t, n: [t] * n, st.text(min_size=1, max_size=3), st.integers(60, 70)))
THREAD = (st.sampled_from(["t", "../x", "a/b", "", " ", "T", "t\ud800"]) | TEXT
          | st.builds(_long, st.sampled_from(["ü", "x", "\U0001f600"]), st.integers(20, 20000)))

SCALAR = (st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70)
          | st.floats(allow_nan=False) | TEXT | st.binary(max_size=8))
STATE = st.recursive(
    SCALAR | st.datetimes(timezones=st.just(UTC)) | st.uuids() | st.decimals(allow_nan=False)
    | st.timedeltas(),
    lambda inner: (st.lists(inner, max_size=4) | st.tuples(inner, inner)
                   | st.dictionaries(st.text(max_size=5) | st.integers(), inner, max_size=4)
                   | st.frozensets(st.integers(), max_size=3)),
    max_leaves=12)
META_KEY = (st.text(max_size=5) | ODD | st.integers() | st.none() | st.booleans()
            | st.floats(allow_nan=False) | st.binary(max_size=3))
META_VALUE = st.recursive(
    SCALAR,
    lambda inner: (st.lists(inner, max_size=3) | st.tuples(inner)
                   | st.dictionaries(META_KEY, inner, max_size=3)
                   | st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=10)
METADATA = (st.none() | st.dictionaries(st.text(max_size=6), META_VALUE, max_size=4)
            | st.dictionaries(META_KEY, META_VALUE, max_size=3)
            | st.builds(lambda k, v: {"scores": {k: v}}, META_KEY, META_VALUE))
CALL = st.fixed_dictionaries({
    "thread": THREAD, "state": STATE, "label": LABEL, "tags": TAGS, "metadata": METADATA,
    "status": st.sampled_from([None, "failed", "completed"]),
    "reason": st.none() | TEXT | LONG_TEXT})

_ = (datetime, timedelta, Decimal, UUID)  # (the value model the STATE strategy draws from)



READER = r"""
import pickle, sys
from datetime import timedelta
from cas_checkpoint import CheckpointStore

root, expected_file = sys.argv[1], sys.argv[2]
with open(expected_file, "rb") as f:
    saved = pickle.load(f)
store = CheckpointStore.open(root)
threads = set(store.threads())
assert threads == {s["thread"] for s in saved}, (threads, saved)


def check(s):
    t, cid = s["thread"], s["id"]
    cp = store.load(t, cid)
    assert cp.state == s["state"] and type(cp.state) is type(s["state"]), (cp.state, s["state"])
    assert (cp.label, cp.tags, cp.metadata, cp.status, cp.reason) == (
        s["label"], tuple(s["tags"]), s["metadata"], s["status"], s["reason"]), (cp, s)
    assert cid in [i.id for i in store.history(t)]
    if s["label"] is not None:
        assert cid in [i.id for i in store.find(t, label=s["label"])]
    for tag in set(s["tags"]):
        assert cid in [i.id for i in store.find(t, tag=tag)]
    for key, value in s["metadata"].items():
        assert cid in [i.id for i in store.find(t, metadata={key: value})]


for s in saved:
    check(s)
for t in threads:  # a second writer
    store.save(t, {"second": "writer"})
    assert store.load(t).state == {"second": "writer"}
store.gc(grace=timedelta(0))
report = store.verify(deep=True)
assert report.ok, report.to_text()
for s in saved:
    check(s)
print("ok", len(saved))
"""


@settings(max_examples=soak(25, 250), deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(st.lists(CALL, min_size=2, max_size=6))
def test_every_save_is_refused_unwritten_or_read_back_by_another_process(
        calls: list[dict[str, Any]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "s")
        store = CheckpointStore.open(root)
        saved = []
        for call in calls:
            before = files(root)
            kw = {k: call[k] for k in ("label", "tags", "metadata", "status")}
            if call["status"] == "failed":
                kw["reason"] = call["reason"]
            try:
                info = store.save(call["thread"], call["state"], **kw)
            except CasError:
                assert files(root) == before, "a refused save wrote something"
                continue
            saved.append({"thread": call["thread"], "id": info.id, "state": call["state"],
                          "label": call["label"], "tags": list(call["tags"]),
                          "metadata": call["metadata"] or {}, "status": call["status"],
                          "reason": kw.get("reason")})
        if not saved:
            return
        expected = os.path.join(tmp, "expected.pickle")
        with open(expected, "wb") as f:
            pickle.dump(saved, f)
        env = dict(os.environ, PYTHONPATH=ROOT)
        got = subprocess.run([sys.executable, "-c", READER, root, expected], env=env,
                             capture_output=True, text=True, timeout=300)
        assert got.returncode == 0, got.stderr[-3000:]
