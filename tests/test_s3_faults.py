"""Flaky object storage: a fault-injecting HTTP proxy in front of the moto server fails
requests with 500/503, stalls, resets, and drops the replies of applied PUTs. Saves either
succeed or raise a cas_checkpoint error; everything that succeeded is there afterwards (checked
through a clean connection straight to moto), and a lost reply never makes a save count twice
or raise a false conflict."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from _faultproxy import KINDS, FaultProxy
from _soak import check_store, make_state, run_all, soak

from cas_checkpoint import CasError, CheckpointStore, StorageError, UnsafeStorageError


def _options(server: dict[str, Any], endpoint: str, timeout: float = 1.0) -> dict[str, Any]:
    opts = copy.deepcopy(server["storage_options"])
    opts["client_kwargs"]["endpoint_url"] = endpoint
    opts["config_kwargs"] = {"connect_timeout": timeout, "read_timeout": timeout,
                             "retries": {"max_attempts": 2, "mode": "standard"}}
    return opts


@pytest.fixture
def proxy(moto_server: dict[str, Any]) -> Iterator[FaultProxy]:
    p = FaultProxy(moto_server["endpoint"], stall=3.0)
    yield p
    p.close()


def _url(server: dict[str, Any]) -> str:
    return f"s3://{server['bucket']}/{uuid.uuid4().hex[:12]}"


def test_lost_reply_of_a_ref_write_is_not_a_conflict(moto_server: dict[str, Any],
                                                    proxy: FaultProxy) -> None:
    """The ref PUT is applied but its reply is lost; the client's retry then gets a 412. The
    write id in the ref's metadata shows it was ours: no ConflictError, no second entry."""
    url = _url(moto_server)
    store = CheckpointStore.open(url, storage_options=_options(moto_server, proxy.endpoint))
    first = store.save("t", make_state(0, 0), metadata={"w": 0, "i": 0})
    ids = [first.id]
    for i, kind in enumerate(["drop_ref", "late_ref", "drop_ref"], start=1):
        proxy.arm(kind)
        ids.append(store.save("t", make_state(0, i), metadata={"w": 0, "i": i},
                              expected_head=ids[-1]).id)
    proxy.arm("drop_ref")  # also without expected_head, and on creating a thread
    ids.append(store.save("t", make_state(0, 4), metadata={"w": 0, "i": 4}).id)
    proxy.arm("drop_ref")
    other = store.save("u", make_state(0, 5), expected_head=None)
    proxy.arm("drop_ref")  # fork creates a ref with If-None-Match: only the write id tells
    store.fork("t", ids[1], "v")
    assert proxy.faults["drop_ref"] == 5 and proxy.faults["late_ref"] == 1
    direct = CheckpointStore.open(url, storage_options=moto_server["storage_options"])
    assert [h.id for h in direct.history("t")] == ids[::-1]
    assert [h.id for h in direct.history("u")] == [other.id]
    assert [h.id for h in direct.history("v")] == ids[1::-1]
    check_store(direct, [("t", i) for i in ids])


def test_transient_failures_are_retried(moto_server: dict[str, Any],
                                        proxy: FaultProxy) -> None:
    url = _url(moto_server)
    store = CheckpointStore.open(url, storage_options=_options(moto_server, proxy.endpoint))
    saved = []
    for i, kind in enumerate(["500", "503", "stall", "reset", "drop"]):
        proxy.arm(kind)
        saved.append(store.save("t", make_state(0, i), metadata={"w": 0, "i": i}).id)
        if kind != "drop":  # drop is for PUTs
            proxy.arm(kind)
        assert store.load("t").id == saved[-1]
    assert sum(proxy.faults.values()) == 9
    direct = CheckpointStore.open(url, storage_options=moto_server["storage_options"])
    assert check_store(direct, [("t", i) for i in saved]) == len(saved)


def test_permanent_failures_fail_fast(moto_server: dict[str, Any]) -> None:
    deny = FaultProxy(moto_server["endpoint"], deny=True)
    try:
        store = CheckpointStore.open(_url(moto_server),
                                     storage_options=_options(moto_server, deny.endpoint))
        with pytest.raises(StorageError, match="AccessDenied.*check the credentials"):
            store.save("t", {"x": 1})
        assert deny.requests == 1  # not retried: waiting does not fix a 403
    finally:
        deny.close()
    store = CheckpointStore.open(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/x",
                                 storage_options=moto_server["storage_options"])
    with pytest.raises(StorageError, match="NoSuchBucket.*create the bucket"):
        store.save("t", {"x": 1})
    with pytest.raises(StorageError, match="NoSuchBucket"):
        store.load("t")


def test_storage_ignoring_conditional_writes_is_refused(moto_server: dict[str, Any]) -> None:
    strip = FaultProxy(moto_server["endpoint"], strip=True)
    try:
        opts = _options(moto_server, strip.endpoint)
        unsafe = CheckpointStore.open(_url(moto_server), storage_options=opts)
        for _ in range(2):  # asking again does not get past it
            with pytest.raises(UnsafeStorageError, match="allow_unsafe=True"):
                unsafe.save("t", {"x": 1})
        assert unsafe.threads() == []
        store = CheckpointStore.open(_url(moto_server), storage_options=opts, allow_unsafe=True)
        a = store.save("t", {"x": 1})
        b = store.save("t", {"x": 2})
        assert [h.id for h in store.history("t")] == [b.id, a.id]
    finally:
        strip.close()


def test_many_writers_through_faults_lose_nothing(moto_server: dict[str, Any],
                                                  proxy: FaultProxy) -> None:
    """Writer processes save through the proxy, which injects a fault into every 6th request
    (every kind in turn); then everything acknowledged is checked straight on moto."""
    writers, saves = soak(3, 8), soak(8, 40)
    proxy.every = 6
    url = _url(moto_server)
    opts = _options(moto_server, proxy.endpoint)
    cfgs = [{"url": url, "storage_options": opts, "role": "writer", "writer": w,
             "threads": ["shared", f"own{w}"], "n": saves} for w in range(writers)]
    results = run_all(cfgs)
    acked = [(t, cid) for r in results for t, cid, _ in r.acked]
    errors = [e for r in results for e in r.errors]
    direct = CheckpointStore.open(url, storage_options=moto_server["storage_options"])
    found = check_store(direct, acked)
    faults = ", ".join(f"{k} {proxy.faults[k]}" for k in KINDS)
    print(f"\n[soak] s3 faults: saves attempted {writers * saves}, acknowledged {len(acked)}, "
          f"errors {len(errors)}, found {found}; {proxy.requests} requests, faults injected "
          f"{sum(proxy.faults.values())} ({faults})")
    for e in errors:  # a failed save is an error of ours with a message, never a crash
        assert " StorageError " in e or " ConflictError " not in e, e
    assert all(proxy.faults[k] > 0 for k in KINDS), proxy.faults
    assert len(acked) + len(errors) == writers * saves
    assert len(acked) >= writers * saves // 2


@pytest.mark.parametrize("expected", [False, True])
def test_lost_reply_then_built_upon_is_not_appended_twice(
        expected: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Our ref write lands, its reply is lost, and another writer builds on it before we look
    again (so the ref no longer carries our write id): the save finds its entry in the log and
    neither appends it twice nor raises a false ConflictError."""
    from cas_checkpoint.backends import RefMismatch

    url = f"memory://lost-{uuid.uuid4().hex[:8]}"
    store, other = CheckpointStore.open(url), CheckpointStore.open(url)
    first = store.save("t", make_state(0, 0), metadata={"w": 0, "i": 0})
    real = store.backend.write_ref

    def lost_reply(key: str, data: bytes, version: str | None, refresh: object = None) -> str:
        real(key, data, version)  # applied...
        other.save("t", make_state(1, 0), metadata={"w": 1, "i": 0})  # ...built upon...
        raise RefMismatch(key)  # ...and the reply we got says 412

    monkeypatch.setattr(store.backend, "write_ref", lost_reply)
    mine = store.save("t", make_state(0, 1), metadata={"w": 0, "i": 1},
                      **({"expected_head": first.id} if expected else {}))
    monkeypatch.undo()
    hist = store.history("t")
    assert [h.id for h in hist][1:] == [mine.id, first.id]
    assert check_store(store, [("t", first.id), ("t", mine.id)]) == 3


@pytest.mark.parametrize(("code", "status", "transient"), [
    ("InternalError", 500, True), ("SlowDown", 503, True), ("ServiceUnavailable", 503, True),
    ("ThrottlingException", 400, True), ("ConditionalRequestConflict", 409, True),
    ("RequestTimeout", 400, True), ("AccessDenied", 403, False), ("NoSuchBucket", 404, False),
    ("InvalidAccessKeyId", 403, False), ("PreconditionFailed", 412, False),
    ("NoSuchKey", 404, False)])
def test_error_classification(code: str, status: int, transient: bool) -> None:
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    from cas_checkpoint.backends.retry import is_precondition, is_transient

    err = ClientError({"Error": {"Code": code, "Message": "m"},
                       "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")
    assert is_transient(err) is transient
    assert is_transient(translate_boto_error(err)) is transient  # as s3fs raises it
    assert is_precondition(translate_boto_error(err)) is (code == "PreconditionFailed")


def test_connection_errors_are_transient() -> None:
    from botocore.exceptions import ConnectionClosedError, EndpointConnectionError, ReadTimeoutError

    from cas_checkpoint.backends.retry import Backoff, is_transient

    assert is_transient(ReadTimeoutError(endpoint_url="http://x"))
    assert is_transient(ConnectionClosedError(endpoint_url="http://x"))
    assert is_transient(EndpointConnectionError(endpoint_url="http://x"))
    assert is_transient(ConnectionResetError())
    assert not is_transient(ValueError("bad"))
    b = Backoff(attempts=5, base=0.1, cap=0.3)
    assert all(0 <= b.delay(n) <= min(0.3, 0.1 * 2 ** n) for n in range(40))


def test_an_endpoint_that_never_answers_is_not_retried(moto_server: dict[str, Any],
                                                       monkeypatch: Any) -> None:
    """A refused connection before the endpoint ever answered is a wrong URL or a server that
    is down: this library does not retry it (botocore's and s3fs's own retries remain), and the
    error says what to check. Counted in calls, not in seconds."""
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    opts = _options(moto_server, f"http://127.0.0.1:{port}")
    store = CheckpointStore.open("s3://cas-test/never", storage_options=opts)
    fs = store.backend.fs  # type: ignore[attr-defined]
    real, calls = fs._call_s3, []

    async def counted(method: str, *a: Any, **kw: Any) -> Any:
        calls.append(method)
        return await real(method, *a, **kw)

    monkeypatch.setattr(fs, "_call_s3", counted)
    with pytest.raises(StorageError, match="could not be reached at all"):
        store.save("t", {"a": 1})
    assert calls == ["get_object"]  # read the ref once: no retry of ours


def test_retries_bounds_the_attempts_at_a_failing_request(moto_server: dict[str, Any]) -> None:
    """Every request answered 503 SlowDown: the store makes ``retries`` attempts (each of which
    s3fs and botocore may retry on their own a fixed number of times): 3 attempts cost three
    times the requests of 1."""
    proxy = FaultProxy(moto_server["endpoint"])
    seen = {}
    try:
        opts = _options(moto_server, proxy.endpoint)
        opts["config_kwargs"]["retries"] = {"max_attempts": 1, "mode": "standard"}
        for retries in (1, 3):
            proxy.every, proxy._cycle = 0, iter(())
            store = CheckpointStore.open(f"s3://cas-test/retries-{uuid.uuid4().hex[:6]}",
                                         storage_options=opts, retries=retries, timeout=5)
            store.save("t", {"a": 1})  # the endpoint answered: later failures are retried
            proxy.every, proxy._cycle = 1, iter(lambda: "503", None)  # every request: SlowDown
            before = proxy.requests
            fresh = CheckpointStore.open(store.url, storage_options=opts, retries=retries)
            with pytest.raises(StorageError, match=f"after {retries} attempts"):
                fresh.count("t")
            seen[retries] = proxy.requests - before
    finally:
        proxy.close()
    assert seen[1] >= 1 and seen[3] == 3 * seen[1], seen
    with pytest.raises(CasError):
        CheckpointStore.open("memory://x", retries=0)
