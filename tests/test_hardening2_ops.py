"""Issue 27, the operations round: the agent tools only add (a model's restore is a new head,
never a rewind), the demo never replaces a thread it did not write, gc's dry run predicts the
run and checks its arguments before changing anything, and gc's local housekeeping fails with
a StorageError that says what to do."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from _hostile import files
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli import cli, cli_json

from cas_checkpoint import CheckpointStore, InvalidArgumentError, StorageError
from cas_checkpoint.agents import TOOL_NAMES, adispatch, dispatch, tool_definitions
from cas_checkpoint.aio import AsyncCheckpointStore


def mem() -> CheckpointStore:
    return CheckpointStore.open(f"memory://ops-{uuid.uuid4().hex[:12]}")


def reachable(store: Any) -> set[str]:
    """Every checkpoint some thread's history holds."""
    return {i.id for t in store.threads() for i in store.history(t)}


# --- 14: restore_checkpoint is a new head; no tool call reduces history -----------------------


def _attempt(store: CheckpointStore, n: int = 13) -> list[str]:
    state: dict[str, Any] = {"messages": []}
    ids = []
    for i in range(n):
        word = "plan" if i < 5 else "abandoned-idea"
        state["messages"].append({"role": "assistant", "content": f"step {i}: {word}"})
        ids.append(store.save("t", state, kind="automatic", status="in_progress").id)
    return ids


def test_restore_checkpoint_saves_a_new_head_and_keeps_the_abandoned_attempt() -> None:
    store = mem()
    ids = _attempt(store)
    got = dispatch(store, "t", "restore_checkpoint", {"checkpoint_id": ids[0]})
    head = store.load("t")
    assert got["restored"]["id"] == ids[0] and got["created"]["id"] == head.id
    assert store.count("t") == 14  # was 13 -> 1 when the tool rewound
    assert head.parent_ids == (ids[-1],) and head.state == store.load("t", ids[0]).state
    assert head.kind == "manual" and head.metadata == {"restored_from": ids[0]}
    assert set(ids) <= {i.id for i in store.history("t")}
    found = dispatch(store, "t", "search_checkpoints",
                     {"query": "abandoned-idea", "all_history": True, "limit": 50})
    assert {m["checkpoint_id"] for m in found["matches"]} == set(ids[5:])
    listed = dispatch(store, "t", "list_checkpoints", {"kind": "manual"})["checkpoints"]
    assert [c["id"] for c in listed] == [head.id]


def test_async_restore_checkpoint_saves_a_new_head() -> None:
    async def main() -> None:
        store = await AsyncCheckpointStore.open(f"memory://ops-{uuid.uuid4().hex[:12]}")
        first = await store.save("t", {"m": 1})
        second = await store.save("t", {"m": 2})
        got = await adispatch(store, "t", "restore_checkpoint", {"checkpoint_id": first.id})
        head = await store.load("t")
        assert got["created"]["id"] == head.id and head.parent_ids == (second.id,)
        assert head.state == {"m": 1} and await store.count("t") == 3
        await store.aclose()

    asyncio.run(main())


ADDING = {"load", "save", "history", "search", "head", "count"}


class OnlyAdds:
    """A store that lets through only the methods that read or add: a tool that reached for
    rewind, delete, prune, repack or gc fails the test whatever its arguments."""

    def __init__(self, store: CheckpointStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        if name not in ADDING:
            raise AssertionError(f"a model's tool call reached store.{name}")
        return getattr(self._store, name)


_IDS = st.one_of(st.integers(0, 40), st.integers(0, 40), st.integers(0, 40),
                 st.text("0123456789abcdef", min_size=64, max_size=64), st.text(max_size=70))
PARAMS = {d["name"]: d["parameters"]["properties"] for d in tool_definitions()}


def _argument(draw: Any, key: str, spec: dict[str, Any], known: list[str]) -> Any:
    """Mostly what the schema asks for (a model follows it, or nearly), sometimes anything."""
    if key in ("checkpoint_id", "before"):
        pick = draw(_IDS)
        return known[pick % len(known)] if isinstance(pick, int) and known else pick
    anything = st.one_of(st.none(), st.booleans(), st.integers(-3, 120), st.text(max_size=30))
    if "enum" in spec:
        fits: Any = st.sampled_from(spec["enum"])
    elif spec.get("type") == "integer":
        fits = st.integers(spec["minimum"], spec["maximum"])
    elif spec.get("type") == "boolean":
        fits = st.booleans()
    else:
        fits = st.sampled_from(["plan", "abandoned-idea", "step", "x" * 201])
    return draw(st.one_of(fits, fits, fits, anything))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_no_sequence_of_tool_calls_reduces_the_checkpoints_in_the_store(data: Any) -> None:
    """Any tool, any arguments a model might send (mostly as the schema says, sometimes not,
    sometimes a tool that does not exist): the checkpoints the store's threads hold only grow,
    and no call reaches a method that rewinds, deletes or prunes."""
    store = mem()
    _attempt(store, 6)
    store.save("other", {"secret": "theirs"})
    names = [*TOOL_NAMES, *TOOL_NAMES, "rewind", "delete_checkpoint", "prune", "gc"]
    spy = OnlyAdds(store)
    before = reachable(store)
    for _ in range(data.draw(st.integers(1, 8))):
        known = sorted(before)
        name = data.draw(st.sampled_from(names))
        params = PARAMS.get(name, {})
        keys = data.draw(st.lists(st.sampled_from([*params, *params, "thread_id", "regex"]),
                                  max_size=3, unique=True))
        args = {k: _argument(data.draw, k, params.get(k, {}), known) for k in keys}
        try:
            dispatch(spy, "t", name, args)
        except InvalidArgumentError:
            pass
        after = reachable(store)
        assert before <= after, (name, args)
        before = after


# --- 15: the demo never replaces a thread it did not write -----------------------------------



@pytest.mark.parametrize("thread", ["support-agent", "support-agent/what-if"])
def test_demo_refuses_a_store_with_the_users_thread_of_its_name(tmp_path: Path,
                                                                 thread: str) -> None:
    url = str(tmp_path / "store")
    store = CheckpointStore.open(url)
    mine = [store.save(thread, {"messages": [f"my own {i}"]}, label="keep").id for i in range(3)]
    before = files(tmp_path / "store")
    code, out, err = cli("demo", url)
    assert code == 2 and out == "", err
    assert repr(thread) in err and "empty folder" in err and "delete-thread" in err
    assert "wrote nothing" in err and len(err.splitlines()) == 1
    assert files(tmp_path / "store") == before  # nothing written, nothing deleted
    again = CheckpointStore.open(url)
    assert again.threads() == [thread] and [i.id for i in again.history(thread)] == mine[::-1]


def test_demo_runs_again_over_its_own_threads_but_not_over_a_users_save(tmp_path: Path) -> None:
    url = str(tmp_path / "demo")
    assert cli("demo", url)[0] == 0
    assert cli("demo", url)[0] == 0  # its own threads, as it left them: replaced
    store = CheckpointStore.open(url)
    assert store.count("support-agent") == 195
    mine = store.save("support-agent", {"messages": ["the user carried on here"]}).id
    code, _, err = cli("demo", url)
    assert code == 2 and "'support-agent'" in err and "'support-agent/what-if'" not in err
    assert CheckpointStore.open(url).head("support-agent") == mine


# --- 16: gc's dry run predicts the run; its arguments are checked before any change ----------

SAME = ("repacked_threads", "repack_freed_bytes", "deleted_objects", "deleted_bytes",
        "scanned_objects", "scanned_bytes", "reachable_objects", "reachable_bytes",
        "young_objects", "young_bytes", "threads")


def _with_garbage(store: CheckpointStore) -> None:
    """Two threads whose packs hold what their logs no longer reach (a prune, a rewind), and a
    fork that still names some of them; plus a deleted thread (packs no ref names)."""
    state: dict[str, Any] = {"messages": []}
    for i in range(40):
        state["messages"].append({"role": "user", "content": f"turn {i} " + "words " * 80})
        store.save("a", state)
    store.fork("a", store.history("a")[30].id, "fork")
    store.prune("a", keep_last=3, keep_labeled=False)
    for i in range(25):
        store.save("b", {"n": i, "text": f"draft {i} " * 200})
    store.rewind("b", store.history("b")[20].id)
    store.save("gone", {"text": "soon deleted " * 300})
    store.delete_thread("gone")


def _packfiles(store: CheckpointStore) -> set[str]:
    return {i.key for i in store._core.backend.list("packs")}


@pytest.mark.parametrize("kind", ["memory", "local"])
def test_gc_dry_run_reports_what_the_run_then_does(kind: str, tmp_path: Path) -> None:
    store = mem() if kind == "memory" else CheckpointStore.open(str(tmp_path / "s"))
    _with_garbage(store)
    packs = _packfiles(store)
    dry = store.gc(grace=timedelta(0), dry_run=True, repack=True)
    assert _packfiles(store) == packs  # a dry run changes nothing
    real = store.gc(grace=timedelta(0), repack=True)
    want, got = dry.to_dict(), real.to_dict()
    assert want["repacked_threads"] >= 2 and want["deleted_objects"] > 0
    assert {k: want[k] for k in SAME} == {k: got[k] for k in SAME}
    assert store.verify().ok


def test_cli_gc_dry_run_predicts_the_gc(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    _with_garbage(CheckpointStore.open(url))
    packs = {p.name for p in (tmp_path / "s").rglob("*") if p.is_file()}
    code, text, err = cli("gc", url, "--grace", "0s", "--dry-run")
    assert code == 0, err
    assert {p.name for p in (tmp_path / "s").rglob("*") if p.is_file()} == packs
    freed = [line for line in text.splitlines() if line.startswith("would free")]
    assert freed and freed[0] != "would free 0 B"  # (it said 0 B; the gc then freed 34.7 KB)
    assert "would repack 0 of" not in text
    would = cli_json("gc", url, "--grace", "0s", "--dry-run")
    done = cli_json("gc", url, "--grace", "0s")
    assert would["deleted_bytes"] > 0 and would["repack_freed_bytes"] > 0
    same = [k for k in SAME if k in done]  # (the old code's JSON had no repacked_threads)
    assert {k: would.get(k) for k in same} == {k: done[k] for k in same}
    assert would["repacked_threads"] == done["repacked_threads"] >= 2
    assert f"would repack {would['repacked_threads']} of" in text


def test_cli_gc_refuses_a_short_grace_on_s3_before_it_repacks(
        moto_server: dict[str, Any]) -> None:
    url = f"s3://{moto_server['bucket']}/ops-{uuid.uuid4().hex[:8]}"
    store = CheckpointStore.open(url, storage_options=moto_server["storage_options"])
    _with_garbage(store)
    packs, heads = _packfiles(store), {t: store.head(t) for t in store.threads()}
    refs = {i.key: i.mtime for i in store._core.backend.list("refs")}
    code, out, err = cli("gc", url, "--grace", "0s", "--endpoint-url", moto_server["endpoint"])
    assert code == 2, err
    assert _packfiles(store) == packs  # no repack ran (it did: packs 4 -> 6)
    assert "--grace 1s" in err and "--force" in err and "Nothing was changed" in err
    assert {i.key: i.mtime for i in store._core.backend.list("refs")} == refs
    assert {t: store.head(t) for t in store.threads()} == heads
    with pytest.raises(InvalidArgumentError, match="force=True"):
        store.gc(grace=timedelta(0), repack=True)
    assert _packfiles(store) == packs


# --- 8: gc's local housekeeping fails with a StorageError that says what to do ---------------

OUT_OF_FDS = r"""
import os, resource, sys
from datetime import timedelta
from cas_checkpoint import CheckpointStore, StorageError
s = CheckpointStore.open(sys.argv[1])
s.save("t", {"a": "x" * 5000}); s.delete_thread("t")
s.gc(grace=timedelta(0))  # leaves <root>/gc, which the next gc lists first
s.save("u", {"a": "y" * 5000}); s.delete_thread("u")
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
try:
    s.gc(grace=timedelta(0))
    outcome = "no error"
except StorageError as exc:
    outcome = "StorageError: " + str(exc)
except BaseException as exc:
    outcome = "bare " + type(exc).__name__ + ": " + str(exc)
for fd in held:
    os.close(fd)
print(outcome)
"""


def test_gc_out_of_file_descriptors_is_a_storage_error(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", OUT_OF_FDS, str(tmp_path / "s")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip()
    assert out.startswith("StorageError: gc could not"), out  # (was: bare OSError)
    assert "file descriptors" in out and "ulimit -n" in out and "run gc again" in out
    store = CheckpointStore.open(str(tmp_path / "s"))  # with descriptors again: it runs
    assert store.gc(grace=timedelta(0)).deleted_objects == 1


def test_gc_when_its_folder_is_a_file(tmp_path: Path) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    keep = store.save("t", {"a": "x" * 5000}).id
    store.save("gone", {"a": "y" * 5000})
    store.delete_thread("gone")
    (tmp_path / "s" / "gc").write_text("not a folder")
    packs = _packfiles(store)
    with pytest.raises(StorageError, match="must be a folder") as caught:
        store.gc(grace=timedelta(0))
    assert "move it away" in str(caught.value) and _packfiles(store) == packs
    code, out, err = cli("gc", str(tmp_path / "s"), "--grace", "0s")
    assert code == 2 and "must be a folder" in err and len(err.splitlines()) == 1, err
    assert "OSError" not in err and "NotADirectoryError" not in err
    (tmp_path / "s" / "gc").unlink()
    assert store.gc(grace=timedelta(0)).deleted_objects == 1 and store.load("t").id == keep
