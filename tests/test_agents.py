"""The agent layer: policies, the recorder and its background checkpointer, status and kind as
stored fields (old entries still read, same ids), per-thread stats, and the LLM tools with
hostile arguments."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import msgpack
import pytest

from cas_checkpoint import CheckpointStore, InvalidArgumentError, StoreStats, ThreadStats
from cas_checkpoint.agents import (
    MAX_ARGUMENTS_CHARS,
    TOOL_NAMES,
    AfterLlmResponse,
    AfterToolCall,
    AsyncRecorder,
    Every,
    Interval,
    Never,
    Policy,
    Recorder,
    adispatch,
    anthropic_tools,
    dispatch,
    openai_tools,
)
from cas_checkpoint.aio import AsyncCheckpointStore
from cas_checkpoint.engine.refs import thread_key
from cas_checkpoint.errors import CasError, FormatError, SerializationError
from cas_checkpoint.format.heads import Head
from cas_checkpoint.format.objects import (
    KINDS,
    MAX_REASON,
    STATUSES,
    CheckpointId,
    LogEntry,
    ObjectId,
    Record,
    Segment,
    object_id,
)


def mem() -> CheckpointStore:
    return CheckpointStore.open(f"memory://agents-{uuid.uuid4().hex[:12]}")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def wait_for(cond: Callable[[], bool], what: str) -> None:
    """Poll until ``cond()`` (a background thread's work); never asserts on time."""
    deadline = time.monotonic() + 30
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.005)


async def await_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.005)


# --- policies: a scripted run gives exactly the expected saves ---------------------------------

SCRIPT: list[tuple[str, dict[str, Any]]] = [
    ("llm_response", {}),                                     # 1
    ("tool_call", {"tool": "search", "ok": True}),            # 2
    ("llm_response", {}),                                     # 3
    ("llm_response", {}),                                     # 4
    ("tool_call", {"tool": "shell", "ok": False}),            # 5
    ("plan", {}),                                             # 6
    ("llm_response", {}),                                     # 7
    ("tool_call", {"tool": "search", "args": {"q": "x"}, "result": "r", "ok": True}),  # 8
]


def run_script(policy: Policy) -> tuple[list[int], CheckpointStore]:
    store = mem()
    rec = Recorder(store, "t", policy=policy)
    saved = []
    for i, (name, details) in enumerate(SCRIPT, start=1):
        info = rec.event(name, {"i": i, "messages": list(range(i))}, **details)
        if info is not None:
            saved.append(i)
    return saved, store


@pytest.mark.parametrize("policy, expected", [
    (Every(1), [1, 2, 3, 4, 5, 6, 7, 8]),
    (Every(3), [3, 6]),
    (Every(2, on="llm_response"), [3, 7]),  # the 2nd and 4th llm_response
    (AfterToolCall(), [2, 5, 8]),
    (AfterToolCall(only_ok=True), [2, 8]),
    (AfterLlmResponse(), [1, 3, 4, 7]),
    (Never(), []),
    (AfterToolCall() | Every(4), [2, 4, 5, 8]),
    (AfterLlmResponse() | Never(), [1, 3, 4, 7]),
    (Never() | Never(), []),
    (AfterToolCall() | AfterLlmResponse() | Every(3), [1, 2, 3, 4, 5, 6, 7, 8]),
])
def test_policy_script(policy: Policy, expected: list[int]) -> None:
    saved, store = run_script(policy)
    assert saved == expected
    if not expected:
        assert store.head("t") is None
        return
    history = store.history("t")[::-1]
    assert [store.load("t", h.id).state["i"] for h in history] == expected
    for h, i in zip(history, expected, strict=True):
        name, details = SCRIPT[i - 1]
        assert (h.kind, h.status, h.reason) == ("automatic", "in_progress", None)
        want: dict[str, Any] = {"event": name}
        want.update((k, details[k]) for k in ("tool", "ok") if k in details)
        assert h.metadata == want  # args and result reach the policy, not the log


def test_interval_policy_on_events_uses_its_clock() -> None:
    clock = FakeClock()
    store = mem()
    rec = Recorder(store, "t", policy=Interval(seconds=10, clock=clock))
    script = [(0, False), (9.5, False), (0.5, True), (0, False), (5, False), (5, True),
              (100, True)]
    got = []
    for i, (advance, _) in enumerate(script):
        clock.advance(advance)
        got.append(rec.event("llm_response", {"i": i}) is not None)
    assert got == [want for _, want in script]
    assert rec.saves == store.count("t") == 3
    # a manual checkpoint counts as a save: the interval restarts from it
    clock.advance(9)
    rec.checkpoint({"i": "manual"})
    clock.advance(9)
    assert rec.event("llm_response", {"i": "x"}) is None
    clock.advance(1)
    assert rec.event("llm_response", {"i": "y"}) is not None


def test_custom_policy_sees_counts_and_details() -> None:
    seen = []

    class OnFailure(Policy):
        def wants(self, event: Any) -> bool:
            seen.append((event.name, event.count, event.count_of_name))
            return event.details.get("ok") is False

    saved, _ = run_script(OnFailure() | Never())
    assert saved == [5]
    names = [n for n, _ in SCRIPT]
    assert seen == [(n, i + 1, names[: i + 1].count(n)) for i, n in enumerate(names)]


@pytest.mark.parametrize("make, words", [
    (lambda: Every(0), "positive int"),
    (lambda: Every(True), "positive int"),
    (lambda: Every(2, on=""), "non-empty"),
    (lambda: Interval(seconds=0), "positive number"),
    (lambda: Interval(seconds=float("inf")), "positive number"),
    (lambda: Interval(seconds=True), "positive number"),
    (lambda: Interval(seconds=1, clock=5), "clock"),  # type: ignore[arg-type]
    (lambda: AfterToolCall(only_ok=1), "True or False"),  # type: ignore[arg-type]
    (lambda: Recorder(mem(), "t", policy="every"), "policy must be a Policy"),  # type: ignore[arg-type]
    (lambda: Recorder(mem(), "", policy=Never()), "thread id"),
    (lambda: Recorder(mem(), "t").event("", {}), "event name"),
    (lambda: Recorder(mem(), "t").event("x" * 201, {}), "event name"),
    (lambda: Recorder(mem(), "t").finish({}, status="in_progress"), "finish"),
    (lambda: Recorder(mem(), "t").finish({}, status="completed", reason="x"), "reason"),
    (lambda: Recorder(mem(), "t").checkpoint({}, kind="urgent"), "kind must be one of"),
    (lambda: Recorder(mem(), "t", policy=Every(2)).background(), "needs an Interval"),
])
def test_bad_policy_and_recorder_arguments(make: Callable[[], Any], words: str) -> None:
    with pytest.raises(InvalidArgumentError, match=words):
        make()


# --- before / finish ---------------------------------------------------------------------------


def test_before_saves_pre_operation_then_recovery_and_reraises() -> None:
    store = mem()
    rec = Recorder(store, "t", policy=Never())
    with pytest.raises(ValueError, match="table is locked"):
        with rec.before("drop_table", {"rows": 3}) as op:
            rec.update({"rows": 0})  # what the operation did before it failed
            raise ValueError("table is locked")
    recovery, pre = store.history("t")
    assert (pre.kind, pre.status, pre.metadata) == ("pre_operation", "in_progress",
                                                    {"operation": "drop_table"})
    assert (recovery.kind, recovery.status) == ("recovery", "failed")
    assert recovery.reason == "drop_table raised ValueError: table is locked"
    assert recovery.metadata == {"operation": "drop_table", "pre_operation": pre.id}
    assert op.checkpoint == pre and op.recovery == recovery
    assert store.load("t", pre.id).state == {"rows": 3}
    assert store.load("t", recovery.id).state == {"rows": 0}
    assert store.find("t", kind="recovery", status="failed") == [recovery]

    with rec.before("vacuum", {"rows": 0}) as ok:  # no error: no recovery checkpoint
        pass
    assert ok.recovery is None and store.count("t") == 3

    with pytest.raises(KeyboardInterrupt):  # not an Exception: passes through unsaved
        with rec.before("wait", {"rows": 0}):
            raise KeyboardInterrupt
    assert store.count("t") == 4 and store.history("t", limit=1)[0].kind == "pre_operation"


def test_before_keeps_the_error_when_the_recovery_save_fails() -> None:
    rec = Recorder(mem(), "t", policy=Never())
    with pytest.raises(RuntimeError) as caught:
        with rec.before("op", {"a": 1}):
            rec.update({"a": object()})  # cannot be stored
            raise RuntimeError("original")
    assert str(caught.value) == "original"
    assert any("recovery checkpoint failed" in n for n in caught.value.__notes__)


def test_finish_statuses_and_reason() -> None:
    store = mem()
    rec = Recorder(store, "t", policy=Never())
    rec.checkpoint({"s": 0}, label="start")
    halted = rec.finish({"s": 1}, status="halted", reason="budget spent")
    failed = Recorder(store, "u").finish({"s": 2}, status="failed", reason="tool crashed")
    done = Recorder(store, "v").finish({"s": 3})
    assert (halted.status, halted.reason, halted.kind) == ("halted", "budget spent", "automatic")
    assert store.find("t", status="halted") == [halted]
    assert store.find("u", status="failed")[0].reason == "tool crashed" == failed.reason
    assert store.load("v").status == "completed" == done.status
    assert store.history("t", kind="manual")[0].label == "start"


# --- the background checkpointer ---------------------------------------------------------------


def test_background_thread_saves_changed_states_only() -> None:
    store = mem()
    clock = FakeClock()
    rec = Recorder(store, "t", policy=Never())
    bg = rec.background(Interval(seconds=60, clock=clock))
    assert bg.running
    clock.advance(60)
    bg.wake()
    wait_for(lambda: bg.looks == 1, "a look with no state given")
    assert store.head("t") is None

    rec.update({"messages": ["a"]})
    clock.advance(60)
    bg.wake()
    wait_for(lambda: rec.saves == 1, "the first background save")
    assert bg.looks == 2
    (info,) = store.history("t")
    assert (info.kind, info.status, info.metadata) == ("automatic", "in_progress",
                                                       {"event": "interval"})

    rec.update({"messages": ["a"]})  # another object, same content: not saved again
    clock.advance(60)
    bg.wake()
    wait_for(lambda: bg.looks == 3, "a look at an unchanged state")
    assert rec.saves == 1 and store.count("t") == 1

    rec.event("llm_response", {"messages": ["a", "b"]})  # Never(): no save; the latest moves
    clock.advance(60)
    bg.wake()
    wait_for(lambda: rec.saves == 2, "a save of the changed state")
    assert store.load("t").state == {"messages": ["a", "b"]}

    rec.checkpoint({"messages": ["a", "b", "c"]})  # saved by the recorder: not again
    clock.advance(60)
    bg.wake()
    wait_for(lambda: bg.looks == 5, "a look after a manual checkpoint")
    assert rec.saves == 3 and store.count("t") == 3

    rec.update({"messages": ["a", "b", "c", "d"]})
    bg.stop(flush=True)  # stops, then saves the changed latest state once
    assert not bg.running
    assert rec.saves == 4 and store.load("t").state["messages"][-1] == "d"
    clock.advance(600)
    bg.wake()  # nothing runs any more
    assert store.count("t") == 4
    again = rec.background(Interval(seconds=1, clock=clock))
    assert again.running  # a new one may start
    rec.finish({"messages": []})  # finish stops it
    assert not again.running


def test_background_thread_is_not_due_before_its_interval() -> None:
    clock = FakeClock()
    rec = Recorder(mem(), "t", policy=Interval(seconds=30, clock=clock))
    rec.update({"x": 1})
    with rec.background() as bg:  # the policy's Interval
        clock.advance(29)
        bg.wake()
        clock.advance(1)
        bg.wake()
        wait_for(lambda: rec.saves == 1, "the save once due")
        assert bg.looks == 1  # the early wake-up did not look
    assert not bg.running


def test_background_error_is_raised_by_stop() -> None:
    clock = FakeClock()
    rec = Recorder(mem(), "t", policy=Never())
    bg = rec.background(Interval(seconds=5, clock=clock))
    rec.update({"bad": object()})
    clock.advance(5)
    bg.wake()
    wait_for(lambda: bg.looks == 1, "the failing look")
    with pytest.raises(SerializationError):
        bg.stop()
    assert not bg.running


def test_finish_saves_after_a_failed_background() -> None:
    clock = FakeClock()
    store = mem()
    rec = Recorder(store, "t", policy=Never())
    bg = rec.background(Interval(seconds=5, clock=clock))
    rec.update({"bad": object()})
    clock.advance(5)
    bg.wake()
    wait_for(lambda: bg.looks == 1, "the failing look")
    info = rec.finish({"ok": 1}, status="failed", reason="bad state")
    assert not bg.running and store.head("t") == info.id and store.count("t") == 1


def test_background_and_events_race_without_duplicates() -> None:
    """A real clock at 1 ms: the thread and the agent save concurrently; the thread never
    saves the state saved just before, and every save the recorder counted is in the thread."""
    store = mem()
    rec = Recorder(store, "t", policy=Every(3))
    with rec.background(Interval(seconds=0.001)):
        for i in range(60):
            rec.event("step", {"i": i // 2})  # each state given twice in a row
            time.sleep(0.0005)
    history = store.history("t")[::-1]
    states = [store.load("t", h.id).state for h in history]
    assert rec.saves == len(states) == store.count("t") >= 20
    by_thread = [i for i, h in enumerate(history) if h.metadata == {"event": "interval"}]
    assert by_thread and all(i == 0 or states[i] != states[i - 1] for i in by_thread)


def test_background_asyncio_task() -> None:
    async def main() -> None:
        store = await AsyncCheckpointStore.open(f"memory://agents-{uuid.uuid4().hex[:12]}")
        clock = FakeClock()
        rec = AsyncRecorder(store, "t", policy=AfterToolCall())
        assert await rec.event("llm_response", {"m": [1]}) is None
        assert await rec.event("tool_call", {"m": [1, 2]}, tool="t") is not None
        async with rec.background(Interval(seconds=10, clock=clock)) as bg:
            clock.advance(10)
            bg.wake()
            await await_for(lambda: bg.looks == 1, "a look at the state just saved")
            assert rec.saves == 1  # the tool_call save left nothing new
            rec.update({"m": [1, 2, 3]})
            clock.advance(10)
            bg.wake()
            await await_for(lambda: rec.saves == 2, "the background save")
            rec.update({"m": [1, 2, 3]})
            clock.advance(10)
            bg.wake()
            await await_for(lambda: bg.looks == 3, "a look at an unchanged state")
            assert rec.saves == 2
        assert not bg.running
        history = await store.history("t")
        assert [h.metadata.get("event") for h in history] == ["interval", "tool_call"]
        assert (await store.load("t")).state == {"m": [1, 2, 3]}

        with pytest.raises(ZeroDivisionError):
            async with rec.before("divide", {"m": []}):
                raise ZeroDivisionError("by zero")
        assert [h.kind for h in await store.history("t", limit=2)] == ["recovery",
                                                                      "pre_operation"]
        bg2 = rec.background(Interval(seconds=10, clock=clock))
        done = await rec.finish({"m": "done"}, status="completed")
        assert not bg2.running and done.status == "completed"
        assert await store.find("t", status="completed") == [done]
        await store.aclose()

    asyncio.run(main())


# --- status and kind: stored, filtered, on every backend ---------------------------------------


def test_status_and_kind_are_stored_and_filtered(store: CheckpointStore,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    plan: list[tuple[str | None, str | None, str | None]] = [(None, None, None)]
    plan += [(STATUSES[i % 4], KINDS[(i // 4) % 4] if i % 5 else None,
              f"why {i}" if STATUSES[i % 4] in ("failed", "halted") else None)
             for i in range(40)]  # past the head's tail: entries in log segments too
    model = []
    for i, (status, kind, reason) in enumerate(plan):
        info = store.save("t", {"i": i}, status=status, kind=kind, reason=reason)
        assert (info.status, info.kind, info.reason) == (status, kind, reason)
        model.append((info.id, status, kind, reason))
    newest = model[::-1]

    def want(keep: Callable[[tuple[Any, ...]], bool]) -> list[str]:
        return [m[0] for m in newest if keep(m)]

    # the filters read log entries only: no state is decoded
    monkeypatch.setattr(store._core, "decode", lambda *a: pytest.fail("decoded a state"))
    assert [i.id for i in store.find("t", status="failed")] == want(lambda m: m[1] == "failed")
    assert [i.id for i in store.find("t", kind="manual")] == want(lambda m: m[2] == "manual")
    assert [i.id for i in store.find("t", status=["failed", "halted"], kind="recovery")] == want(
        lambda m: m[1] in ("failed", "halted") and m[2] == "recovery")
    assert [i.id for i in store.history("t", kind="automatic", limit=3)] == want(
        lambda m: m[2] == "automatic")[:3]
    assert [i.id for i in store.history("t", status="completed")] == want(
        lambda m: m[1] == "completed")
    assert [(i.id, i.status, i.kind, i.reason) for i in store.history("t")] == newest
    monkeypatch.undo()

    cp = store.load("t", model[3][0])
    assert (cp.status, cp.kind, cp.reason) == model[3][1:]
    other = CheckpointStore.from_backend(store.backend)  # a fresh reader, no caches
    assert [(i.id, i.status, i.kind, i.reason) for i in other.history("t")] == newest
    assert store.verify().ok


@pytest.mark.parametrize("kw, words", [
    ({"status": "done"}, "status must be one of"),
    ({"status": 1}, "status must be one of"),
    ({"kind": "MANUAL"}, "kind must be one of"),
    ({"reason": "x"}, "status='failed'"),
    ({"status": "in_progress", "reason": "x"}, "status='failed'"),
    ({"status": "failed", "reason": 7}, "reason must be a str"),
    ({"status": "failed", "reason": "x" * (MAX_REASON + 1)}, "at most"),
])
def test_save_checks_status_kind_reason(kw: dict[str, Any], words: str) -> None:
    store = mem()
    with pytest.raises(InvalidArgumentError, match=words):
        store.save("t", {}, **kw)
    assert store.head("t") is None


@pytest.mark.parametrize("kw", [{"status": "done"}, {"kind": ["manual", "x"]}, {"kind": []},
                                {"status": 3}, {"kind": {"manual": 1}}])
def test_filters_are_checked(kw: dict[str, Any]) -> None:
    store = mem()
    store.save("t", {})
    with pytest.raises(InvalidArgumentError):
        store.find("t", **kw)
    with pytest.raises(InvalidArgumentError):
        store.history("t", **kw)


# --- old entries and records: still read, same bytes and ids ------------------------------------

# Encoded by the code before status/kind existed (same fields as built below).
OLD_RECORD = bytes.fromhex(
    "434153430399aa7468726561642d6f6c6491c420cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"
    "cdcdcdcdcdcdcdcdc416000082a86d6573736167657391a26869a4737465700103cb41d954fc4020000014a3"
    "6c626c91a17481a16b01")
OLD_RECORD_ID = "40f014141d1c721be2c7ad1c778e6907e337b03f90f601369ee65cb3fb03ddd2"
OLD_SEGMENT = bytes.fromhex(
    "4341534c0382a17600a1659298c42040f014141d1c721be2c7ad1c778e6907e337b03f90f601369ee65cb3fb"
    "03ddd291c420cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd03cb41d954fc"
    "4020000014a36c626c91a17481a16b0198c420efefefefefefefefefefefefefefefefefefefefefefefefef"
    "efefefefefefefc004cb41d954fc4040000014c09080")


def test_old_records_and_entries_decode_and_keep_their_ids() -> None:
    assert object_id(OLD_RECORD) == OLD_RECORD_ID
    rec = Record.decode(OLD_RECORD)
    assert (rec.status, rec.kind, rec.reason) == (None, None, None)
    assert rec.encode() == OLD_RECORD  # re-encoded: the same bytes, so the same id
    rebuilt = Record(rec.thread_id, rec.parents, rec.root, rec.step, rec.created_at, rec.size,
                     rec.label, rec.tags, rec.metadata, rec.root_node)
    assert rebuilt.encode() == OLD_RECORD  # a checkpoint saved without them: today's bytes
    seg = Segment.decode(OLD_SEGMENT)
    assert [(e.status, e.kind, e.reason) for e in seg.entries] == [(None, None, None)] * 2
    assert seg.entries[0] == rec.entry(CheckpointId(OLD_RECORD_ID))
    assert seg.encode() == OLD_SEGMENT
    head = Head("thread-old", seg.entries[-1].id, 4, tail=seg.entries)
    assert Head.decode(head.encode()).tail == seg.entries


def test_a_save_without_status_or_kind_writes_the_old_layout() -> None:
    store = mem()
    plain = store.save("t", {"a": 1})
    marked = store.save("t", {"a": 2}, kind="manual")
    view = store.objects.view(store.refs.read("t").head)
    body = msgpack.unpackb(view.get(plain.id)[5:])
    assert len(body) == 9  # exactly the items a record had before
    assert len(msgpack.unpackb(view.get(marked.id)[5:])) == 11  # status nil, then kind
    assert Record.decode(view.get(marked.id)).kind == "manual"


def _raw_record(extra: list[Any]) -> bytes:
    body = ["t", [], b"\x00\x00x", 0, 1.0, 3, None, [], {}, *extra]
    return b"CASC\x03" + bytes(msgpack.packb(body, use_bin_type=True))


def test_new_fields_round_trip_and_decode_strictly() -> None:
    for status, kind, reason in [("failed", "recovery", "boom"), (None, "manual", None),
                                 ("completed", None, None), ("halted", None, "r")]:
        rec = Record("t", (), ObjectId("ab" * 32), 0, 1.0, 3, status=status, kind=kind,
                     reason=reason)
        back = Record.decode(rec.encode())
        assert (back.status, back.kind, back.reason) == (status, kind, reason)
        entry = rec.entry(CheckpointId("cd" * 32))
        assert LogEntry.unpack(entry.pack()) == entry
    assert Record.decode(_raw_record(["failed", None, "r"])).reason == "r"
    bad: list[tuple[list[Any], str]] = [
        (["bogus"], "status"), ([None], "nil"), (["failed", None, None], "nil"),
        ([None, "auto"], "kind"), (["failed", None, 5], "reason"),
        (["failed", None, "x" * (MAX_REASON + 1)], "reason"),
        (["failed", None, "r", 1], "9-item"), ([["failed"]], "status")]
    for extra, words in bad:
        with pytest.raises(FormatError, match=words):
            Record.decode(_raw_record(extra))
    good = LogEntry(CheckpointId("ab" * 32), (), 0, 1.0, 1).pack()
    with pytest.raises(FormatError, match="status"):
        LogEntry.unpack([*good, "paused"])
    with pytest.raises(FormatError, match="8-item"):
        LogEntry.unpack([*good, "failed", "manual", "r", "extra"])


# --- stats by thread ---------------------------------------------------------------------------


def test_stats_by_thread(store: CheckpointStore) -> None:
    state: dict[str, Any] = {"messages": [f"message {i} " * 30 for i in range(150)], "step": 0}
    for step in range(6):
        state = {"messages": [*state["messages"], f"reply {step}"], "step": step}
        store.save("a", state)
    store.fork("a", store.head("a"), "b")  # type: ignore[arg-type]
    store.save("b", {**state, "messages": [*state["messages"], "forked"]})
    store.save("c", ["no", "messages", "here"])
    plain = store.stats()
    st = store.stats(by_thread=True)
    assert plain.by_thread == {}
    assert (st.threads, st.checkpoints, st.logical_bytes) == (plain.threads, plain.checkpoints,
                                                              plain.logical_bytes)
    assert set(st.by_thread) == {"a", "b", "c"}
    packs = {i.key: i.size for i in store.backend.list("packs")}
    refs = {i.key: i.size for i in store.backend.list("refs")}
    for thread, got in st.by_thread.items():
        history = store.history(thread)
        state_now = store.load(thread).state
        ref = store.backend.read_ref(thread_key(thread))  # (a local ref file holds slots)
        assert ref is not None
        head = Head.decode(ref[0])
        physical = refs[thread_key(thread)] + sum(
            packs[f"packs/{p.id[:2]}/{p.id[2:]}"] for p in head.packs)
        assert got == ThreadStats(
            checkpoints=len(history),
            messages=len(state_now["messages"]) if isinstance(state_now, dict) else None,
            logical_bytes=sum(h.size for h in history),
            physical_bytes=physical,
            dedup_ratio=sum(h.size for h in history) / physical,
            packs=len(head.packs))
    assert st.by_thread["a"].messages == 156 and st.by_thread["b"].messages == 157
    assert st.by_thread["c"].messages is None
    # b shares a's packs: each counts them, so the sum exceeds what is stored
    assert sum(t.physical_bytes for t in st.by_thread.values()) > st.physical_bytes
    with pytest.raises(InvalidArgumentError):
        store.stats(by_thread="yes")  # type: ignore[arg-type]


def test_stats_of_one_thread_is_the_store() -> None:
    store = mem()
    for i in range(20):
        store.save("only", {"messages": [f"m{j}" * 40 for j in range(i * 10)]})
    (before,) = store.stats(by_thread=True).by_thread.values()
    assert before.physical_bytes < store.storage_bytes()  # packs merged away, not yet collected
    store.gc(grace=timedelta(0))
    st = store.stats(by_thread=True)
    (one,) = st.by_thread.values()
    assert one == before  # what the thread names did not change
    assert one.physical_bytes == store.storage_bytes() == st.physical_bytes
    assert one.logical_bytes == st.logical_bytes and one.checkpoints == 20
    assert one.dedup_ratio == pytest.approx(st.dedup_ratio)
    assert StoreStats(1, 2, 3, 4, 5, 0.75).by_thread == {}  # old positional shape still builds


# --- LLM tools ---------------------------------------------------------------------------------


def test_tool_definitions_in_both_shapes() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    oa, an = openai_tools(), anthropic_tools()
    assert [t["function"]["name"] for t in oa] == [t["name"] for t in an] == list(TOOL_NAMES)
    assert set(TOOL_NAMES) == {"list_checkpoints", "create_checkpoint", "restore_checkpoint",
                               "search_checkpoints"}
    for o, a in zip(oa, an, strict=True):
        assert o["type"] == "function" and set(o["function"]) == {"name", "description",
                                                                   "parameters"}
        assert set(a) == {"name", "description", "input_schema"}
        assert o["function"]["parameters"] == a["input_schema"]
        schema = a["input_schema"]
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        json.dumps(o)  # JSON-ready
    an[0]["input_schema"]["properties"].clear()  # callers get copies
    assert anthropic_tools()[0]["input_schema"]["properties"]


def _thread_with_history() -> tuple[CheckpointStore, list[CheckpointId]]:
    store = mem()
    ids = [store.save("t", {"messages": [f"m{j}" for j in range(i)]}, kind="automatic",
                      status="in_progress").id for i in range(5)]
    return store, ids


def test_dispatch_list_create_restore() -> None:
    store, ids = _thread_with_history()
    got = dispatch(store, "t", "list_checkpoints", '{"limit": 2}')
    assert [c["id"] for c in got["checkpoints"]] == ids[::-1][:2]
    page = dispatch(store, "t", "list_checkpoints", {"before": ids[3], "limit": 10})
    assert [c["id"] for c in page["checkpoints"]] == ids[:3][::-1]
    assert dispatch(store, "t", "list_checkpoints", {"kind": "manual"}) == {"checkpoints": []}
    assert dispatch(store, "nobody", "list_checkpoints", None) == {"checkpoints": []}
    json.dumps(got)

    made = dispatch(store, "t", "create_checkpoint",
                    json.dumps({"label": "before-deploy", "note": "risky"}))["created"]
    head = store.load("t")
    assert head.id == made["id"] and head.label == "before-deploy" and head.kind == "manual"
    assert head.metadata == {"note": "risky"} and head.state == store.load("t", ids[-1]).state
    given = dispatch(store, "t", "create_checkpoint", {}, state={"messages": ["new"]})
    assert store.load("t").state == {"messages": ["new"]} and given["created"]["label"] is None
    listed = dispatch(store, "t", "list_checkpoints", {"kind": "manual", "limit": 5})
    assert [c["id"] for c in listed["checkpoints"]] == [given["created"]["id"], made["id"]]
    assert listed["checkpoints"][1]["note"] == "risky"

    back = dispatch(store, "t", "restore_checkpoint", {"checkpoint_id": ids[1]})
    assert back["restored"]["id"] == ids[1] and back["created"]["id"] == store.head("t")
    assert store.load("t").state == store.load("t", ids[1]).state
    assert store.count("t") == 8  # a restore adds a checkpoint: nothing leaves the history


HUGE = "x" * (MAX_ARGUMENTS_CHARS + 1)


@pytest.mark.parametrize("name, arguments, words", [
    ("drop_all", {}, "there is no tool"),
    (None, {}, "there is no tool"),
    ("list_checkpoints " * 10_000, {}, "there is no tool"),
    ("list_checkpoints", "{not json", "not valid JSON"),
    ("list_checkpoints", "[1, 2]", "must be a JSON object"),
    ("list_checkpoints", "5", "must be a JSON object"),
    ("list_checkpoints", b"\xff\xfe", "not valid JSON"),
    ("list_checkpoints", '{"limit": NaN}', "not JSON"),
    ("list_checkpoints", '{"limit": 2, "limit": 3}', "twice"),
    ("list_checkpoints", "[" * 8_000 + "]" * 8_000, "not valid JSON"),
    ("list_checkpoints", json.dumps({"q": HUGE}), "characters long"),
    ("list_checkpoints", {"limit": "5"}, "integer from 1 to 100"),
    ("list_checkpoints", {"limit": True}, "integer from 1 to 100"),
    ("list_checkpoints", {"limit": 5.0}, "integer from 1 to 100"),
    ("list_checkpoints", {"limit": 0}, "integer from 1 to 100"),
    ("list_checkpoints", {"limit": 101}, "integer from 1 to 100"),
    ("list_checkpoints", {"limit": 10 ** 400}, "integer of"),
    ("list_checkpoints", {"limit": list(range(100_000))}, "list of 100000 items"),
    ("list_checkpoints", {"kind": "bogus"}, "must be one of"),
    ("list_checkpoints", {"status": ["failed"]}, "must be a string"),
    ("list_checkpoints", {"thread_id": "someone-else"}, "unknown argument 'thread_id'"),
    ("list_checkpoints", {"before": "abc"}, "64 lowercase hex"),
    ("list_checkpoints", {"before": "AB" * 32}, "64 lowercase hex"),
    ("list_checkpoints", {"before": "\u0663" * 64}, "64 lowercase hex"),  # arabic digits
    ("list_checkpoints", {"before": "ab" * 32}, "not in this conversation"),
    ("create_checkpoint", {"label": ""}, "1 to 200 characters"),
    ("create_checkpoint", {"label": HUGE}, "1 to 200 characters"),
    ("create_checkpoint", {"note": HUGE * 10}, "1 to 2000 characters"),
    ("create_checkpoint", {"label": {"nested": "x"}}, "must be a string"),
    ("create_checkpoint", {1: "x"}, "unknown argument 1"),
    ("restore_checkpoint", {}, "'checkpoint_id' is required"),
    ("restore_checkpoint", {"checkpoint_id": None}, "'checkpoint_id' is required"),
    ("restore_checkpoint", {"checkpoint_id": "ab" * 32}, "not in this conversation"),
    ("restore_checkpoint", {"checkpoint_id": "../" * 30}, "64 lowercase hex"),
    ("restore_checkpoint", '{"checkpoint_id": 12}', "must be a string"),
    ("search_checkpoints", {}, "'query' is required"),
    ("search_checkpoints", {"query": ""}, "1 to 200 characters"),
    ("search_checkpoints", {"query": HUGE}, "1 to 200 characters"),
    ("search_checkpoints", {"query": "x", "regex": True}, "unknown argument 'regex'"),
    ("search_checkpoints", {"query": "x", "all_history": "yes"}, "true or false"),
    ("search_checkpoints", {"query": "x", "limit": 51}, "integer from 1 to 50"),
])
def test_dispatch_refuses_bad_calls(name: Any, arguments: Any, words: str) -> None:
    store, ids = _thread_with_history()
    store.save("other", {"secret": 1})
    with pytest.raises(InvalidArgumentError, match=words) as caught:
        dispatch(store, "t", name, arguments)
    assert len(str(caught.value)) < 400  # a message a model can read, never an echo of input
    assert store.head("t") == ids[-1] and store.count("t") == len(ids)  # nothing changed


def test_dispatch_cannot_reach_another_thread() -> None:
    store, _ = _thread_with_history()
    theirs = store.save("other", {"secret": 1}).id
    with pytest.raises(InvalidArgumentError, match="not in this conversation"):
        dispatch(store, "t", "restore_checkpoint", {"checkpoint_id": theirs})
    with pytest.raises(InvalidArgumentError, match="not in this conversation"):
        dispatch(store, "t", "list_checkpoints", {"before": theirs})


def test_dispatch_search() -> None:
    if not hasattr(CheckpointStore, "search"):
        pytest.skip("store.search is the search helper's part and is not in this tree yet")
    store = mem()
    store.save("t", {"messages": [{"content": "hello"}, {"content": "our Refund policy"}]})
    store.save("other", {"messages": [{"content": "refund policy too"}]})
    got = dispatch(store, "t", "search_checkpoints", {"query": "refund policy"})
    assert got["count"] == 1 and "Refund policy" in got["matches"][0]["snippet"]
    assert got["matches"][0]["checkpoint_id"] == store.head("t")
    json.dumps(got)


def test_adispatch_on_the_async_store() -> None:
    async def main() -> None:
        store = await AsyncCheckpointStore.open(f"memory://agents-{uuid.uuid4().hex[:12]}")
        first = await store.save("t", {"m": 1})
        await store.save("t", {"m": 2})
        made = await adispatch(store, "t", "create_checkpoint", '{"label": "x"}')
        assert (await store.load("t")).state == {"m": 2}
        listed = await adispatch(store, "t", "list_checkpoints", {"limit": 1})
        assert listed["checkpoints"][0]["id"] == made["created"]["id"]
        back = await adispatch(store, "t", "restore_checkpoint", {"checkpoint_id": first.id})
        assert back["restored"]["id"] == first.id and await store.count("t") == 4
        assert (await store.load("t")).state == {"m": 1}
        with pytest.raises(InvalidArgumentError, match="unknown argument"):
            await adispatch(store, "t", "list_checkpoints", {"everything": True})
        with pytest.raises(CasError):
            await adispatch(store, "t", "restore_checkpoint", {"checkpoint_id": "ab" * 32})
        await store.aclose()

    asyncio.run(main())
