"""The S3 backend's async face, natively async: every primitive is awaited on the caller's event
loop through s3fs's coroutines (no thread per call, no fsspec I/O loop), against the moto server
over HTTP. Each test runs its coroutine with ``asyncio.run`` (no pytest plugin needed)."""

from __future__ import annotations

import asyncio
import copy
import gc
import socket
import threading
import uuid
import warnings
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest
from _faultproxy import FaultProxy

from cas_checkpoint import InvalidArgumentError, StorageError, UnsafeStorageError
from cas_checkpoint.backends import (
    LocalBackend,
    MemoryBackend,
    RefMismatch,
    backend_for,
    open_backend,
    open_backend_async,
)
from cas_checkpoint.backends.s3 import S3Backend

T = TypeVar("T")


def _url(server: dict[str, Any]) -> str:
    return f"s3://{server['bucket']}/{uuid.uuid4().hex[:12]}"


def _options(server: dict[str, Any], endpoint: str | None = None) -> dict[str, Any]:
    opts = copy.deepcopy(server["storage_options"])
    if endpoint is not None:
        opts["client_kwargs"]["endpoint_url"] = endpoint
        opts["config_kwargs"] = {"connect_timeout": 2, "read_timeout": 2,
                                 "retries": {"max_attempts": 2, "mode": "standard"}}
    return opts


async def _open(url: str, options: dict[str, Any], **kw: Any) -> S3Backend:
    backend = await open_backend_async(url, options, **kw)
    assert isinstance(backend, S3Backend) and backend.fs.asynchronous
    return backend


def _run(main: Callable[[S3Backend], Coroutine[Any, Any, T]], server: dict[str, Any],
         **kw: Any) -> T:
    """``main(backend)`` on a fresh loop, with a backend opened (and closed) on that loop."""
    async def go() -> T:
        backend = await _open(_url(server), server["storage_options"], **kw)
        try:
            return await main(backend)
        finally:
            await backend.aclose()

    return asyncio.run(go())


class Sent:
    """Records each request the backend's botocore client sends: (operation, URL, thread)."""

    def __init__(self, backend: S3Backend) -> None:
        self.requests: list[tuple[str, str, int]] = []
        self.on_send: Callable[[], None] | None = None
        backend.fs.s3.meta.events.register("before-send.s3", self._hook)

    def _hook(self, request: Any = None, event_name: str = "", **_: Any) -> None:
        self.requests.append((event_name.rsplit(".", 1)[-1], str(request.url),
                              threading.get_ident()))
        if self.on_send is not None:
            self.on_send()

    def ops(self, name: str) -> list[str]:
        return [url for op, url, _ in self.requests if op == name]

    def probes(self) -> set[str]:
        """The distinct scratch keys of conditional-write probes seen (one per probe run)."""
        return {url.split("/probe/", 1)[1].split("?")[0] for _, url, _ in self.requests
                if "/probe/" in url}


def test_every_primitive_round_trips_through_the_async_face(moto_server: dict[str, Any]) -> None:
    async def main(b: S3Backend) -> None:
        objects = {f"packs/{i:02x}/{i}": bytes([i]) * (i + 1) for i in range(12)}
        await b.aput_many(objects)
        await b.aput_many({"packs/00/0": b"\x00"})  # an existing object: left as it is
        got = await b.aget_many([*objects, "packs/zz/missing"])
        assert got == {**objects, "packs/zz/missing": None}

        assert await b.aread_ref("refs/t") is None
        v1 = await b.awrite_ref("refs/t", b"one", None)
        assert await b.aread_ref("refs/t") == (b"one", v1)
        with pytest.raises(RefMismatch):  # create-if-absent on an existing ref
            await b.awrite_ref("refs/t", b"other", None)
        v2 = await b.awrite_ref("refs/t", b"two", v1, refresh=lambda: None)  # refresh ignored
        assert v2 != v1
        with pytest.raises(RefMismatch):  # a stale version
            await b.awrite_ref("refs/t", b"three", v1)
        with pytest.raises(RefMismatch):
            await b.adelete_ref("refs/t", v1)
        await b.awrite_ref("refs/u", b"u", None)
        refs = await b.aread_refs(["refs/t", "refs/missing", "refs/u"])
        assert [r and r[0] for r in refs] == [b"two", None, b"u"]
        assert refs[0] == (b"two", v2)

        listed = await b.alist("packs/03")
        assert [(i.key, i.size) for i in listed] == [("packs/03/3", 4)]
        many = await b.alist_many([f"packs/{i:02x}" for i in range(12)])  # one request path
        assert sorted(i.key for i in many) == sorted(objects)
        few = await b.alist_many(["packs/01", "packs/02/", "refs"])  # a paginator per prefix
        assert sorted(i.key for i in few) == ["packs/01/1", "packs/02/2", "refs/t", "refs/u"]

        assert await b.adelete_many([*list(objects)[:6], "packs/zz/missing"]) == []
        await b.adelete_ref("refs/t", v2)
        assert await b.aread_ref("refs/t") is None
        assert len(await b.alist_many([f"packs/{i:02x}" for i in range(12)])) == 6

        # what the async face wrote is on S3: a sync backend on the same URL sees it
        sync = open_backend(b.url, moto_server["storage_options"])
        assert sync.get_many(list(objects)) == {k: (None if n < 6 else v)
                                                for n, (k, v) in enumerate(objects.items())}
        assert sync.read_refs(["refs/t", "refs/u"])[1] == refs[2]

    _run(main, moto_server)


def test_reads_are_concurrent_and_bounded_by_concurrency(moto_server: dict[str, Any]) -> None:
    """aget_many, aread_refs and alist_many keep up to ``concurrency`` requests in flight, and
    no more (counted between botocore's before-send and response-received events)."""
    async def main(b: S3Backend) -> None:
        await b.aput_many({f"packs/{i:02x}/{i}": b"p" for i in range(20)})
        for i in range(20):
            await b.awrite_ref(f"refs/{i}", b"r", None)
        b.concurrency = 4
        sent = Sent(b)
        flight = {"now": 0, "peak": 0}

        def start() -> None:
            flight["now"] += 1
            flight["peak"] = max(flight["peak"], flight["now"])

        def end(**_: Any) -> None:
            flight["now"] -= 1

        sent.on_send = start
        b.fs.s3.meta.events.register("response-received.s3", end)
        reads: list[Callable[[], Awaitable[Any]]] = [
            lambda: b.aget_many(f"packs/{i:02x}/{i}" for i in range(20)),
            lambda: b.aread_refs([f"refs/{i}" for i in range(20)]),
            lambda: b.alist_many([f"packs/{i:02x}" for i in range(4)])]
        for read in reads:
            flight["peak"] = 0
            assert len(await read()) == (4 if read is reads[2] else 20)
            assert 2 <= flight["peak"] <= 4, flight
        assert len(sent.requests) == 20 + 20 + 4

    _run(main, moto_server)


def test_storage_failures_map_to_storage_error_as_the_sync_methods_do(
        moto_server: dict[str, Any]) -> None:
    """A missing bucket (an OSError from s3fs) and a refused connection (a botocore error that
    is no OSError) become StorageError with the same hints as on the sync path."""
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main() -> None:
        bucket = await _open(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/x",
                             moto_server["storage_options"])
        with pytest.raises(StorageError, match="NoSuchBucket.*create the bucket"):
            await bucket.aread_ref("refs/t")
        with pytest.raises(StorageError, match="NoSuchBucket"):
            await bucket.aget_many(["a", "b"])
        await bucket.aclose()
        dead = await _open("s3://cas-test/x", _options(moto_server, f"http://127.0.0.1:{port}"))
        with pytest.raises(StorageError, match="could not be reached at all") as caught:
            await dead.alist("refs")
        assert not isinstance(caught.value.__cause__, StorageError)
        await dead.aclose()

    asyncio.run(main())


def test_compare_and_swap_race_has_one_winner_per_version(moto_server: dict[str, Any]) -> None:
    """20 writers race to replace one ref from the same version, 6 times in a row (the first
    time creating it): each time exactly one wins and the 19 others get RefMismatch."""
    async def main(b: S3Backend) -> None:
        version: str | None = None
        for round_ in range(6):
            async def write(w: int, expected: str | None = version,
                            n: int = round_) -> tuple[int, str | BaseException]:
                try:
                    return w, await b.awrite_ref("refs/race", f"{n}:{w}".encode(), expected)
                except RefMismatch as exc:
                    return w, exc

            results = await asyncio.gather(*(write(w) for w in range(20)))
            winners = [(w, r) for w, r in results if isinstance(r, str)]
            assert len(winners) == 1, (round_, results)
            assert all(isinstance(r, RefMismatch) for w, r in results if w != winners[0][0])
            (w, version), = winners
            assert await b.aread_ref("refs/race") == (f"{round_}:{w}".encode(), version)

    _run(main, moto_server)


def test_probe_runs_once_under_concurrent_first_writes(moto_server: dict[str, Any]) -> None:
    """30 first writes (ref creations and pack writes) start at once on a fresh backend: they
    wait for a single conditional-write probe, counted in the requests sent."""
    async def main(b: S3Backend) -> None:
        sent = Sent(b)
        writes: list[Awaitable[Any]] = [b.awrite_ref(f"refs/t{i}", b"x", None)
                                        for i in range(20)]
        writes += [b.aput_many({f"packs/p{i}": b"p"}) for i in range(10)]
        results = await asyncio.gather(*writes)
        assert all(isinstance(v, str) for v in results[:20])
        assert len(sent.probes()) == 1, sent.probes()
        assert len(sent.ops("PutObject")) == 3 + 30  # the probe's three PUTs, then the writes
        await b.awrite_ref("refs/later", b"y", None)
        assert len(sent.probes()) == 1  # and never again

    _run(main, moto_server)


@pytest.mark.parametrize(("strip", "reason"), [
    ({"strip": True}, "If-None-Match: \\* on PUT"),
    ({"strip_only": (("PUT", "if-match"),)}, "If-Match on PUT"),
    ({"strip_only": (("DELETE", "if-match"),)}, "If-Match on DELETE"),
])
def test_storage_ignoring_conditions_is_refused_through_the_async_face(
        moto_server: dict[str, Any], strip: dict[str, Any], reason: str) -> None:
    """A proxy drops conditional headers (all, or If-Match on PUT or DELETE only): the probe
    finds out and every async write raises UnsafeStorageError, again and again; nothing was
    written. With allow_unsafe=True the same endpoint is written to."""
    proxy = FaultProxy(moto_server["endpoint"], **strip)
    url, opts = _url(moto_server), _options(moto_server, proxy.endpoint)

    async def main() -> None:
        b = await _open(url, opts)
        for _ in range(2):  # asking again does not get past it
            with pytest.raises(UnsafeStorageError, match=f"{reason}.*allow_unsafe=True"):
                await b.awrite_ref("refs/t", b"x", None)
            with pytest.raises(UnsafeStorageError, match=reason):
                await b.aput_many({"packs/a": b"a"})
            with pytest.raises(UnsafeStorageError, match=reason):
                await b.adelete_ref("refs/t", '"0"')
        assert await b.alist_many(["refs", "packs"]) == []
        await b.aclose()
        unsafe = await _open(url, opts, allow_unsafe=True)
        version = await unsafe.awrite_ref("refs/t", b"x", None)
        assert await unsafe.aread_ref("refs/t") == (b"x", version)
        await unsafe.aclose()

    try:
        asyncio.run(main())
    finally:
        proxy.close()


def _threads() -> set[threading.Thread]:
    """Live threads other than moto's werkzeug request handlers (a thread per connection)."""
    return {t for t in threading.enumerate() if "process_request_thread" not in t.name}


def test_no_thread_per_call(moto_server: dict[str, Any]) -> None:
    """After one warm-up call (aiobotocore builds its TLS contexts once, on a thread), 200
    concurrent aget_many calls and a write start no thread, hand nothing to an executor, and
    every request is sent from the caller's thread (its event loop)."""
    async def main(b: S3Backend) -> None:
        await b.aput_many({f"packs/{i}": bytes([i]) for i in range(4)})  # warm-up (+ probe)
        sent = Sent(b)
        loop = asyncio.get_running_loop()
        handed: list[Any] = []
        real = loop.run_in_executor

        def counted(executor: Any, fn: Any, *args: Any) -> Any:
            handed.append(fn)
            return real(executor, fn, *args)

        loop.run_in_executor = counted  # type: ignore[method-assign]
        before = _threads()
        keys = [f"packs/{i}" for i in range(4)]
        got = await asyncio.gather(*(b.aget_many(keys[n % 4:]) for n in range(200)))
        await b.awrite_ref("refs/t", b"x", None)
        assert got[5] == {k: bytes([int(k[-1])]) for k in keys[1:]}
        assert handed == []
        # (none started; one of another test's pools may end meanwhile: local disk's pool
        # threads finish the deletions a commit deferred after it answered)
        assert _threads() <= before, {t.name for t in _threads() - before}
        assert len(sent.ops("GetObject")) == sum(4 - n % 4 for n in range(200))
        assert {ident for _, _, ident in sent.requests} == {threading.get_ident()}

    _run(main, moto_server)


def test_sync_methods_of_an_async_backend_raise_a_clear_error(
        moto_server: dict[str, Any]) -> None:
    """Inside the loop (where blocking would deadlock) and after it: InvalidArgumentError
    naming the awaitable methods, no request sent, and no coroutine left never awaited."""
    backend: S3Backend | None = None

    def check(b: S3Backend) -> None:
        calls: list[Callable[[], Any]] = [
            lambda: b.get("packs/a"), lambda: b.get_many(["packs/a"]),
            lambda: b.put_many({"packs/a": b"a"}), lambda: b.read_ref("refs/t"),
            lambda: b.read_refs(["refs/t"]), lambda: b.write_ref("refs/t", b"x", None),
            lambda: b.delete_ref("refs/t", '"0"'), lambda: b.list("packs"),
            lambda: b.list_many(["packs"]), lambda: b.delete_many(["packs/a"])]
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for call in calls:
                with pytest.raises(InvalidArgumentError, match="awaitable methods"):
                    call()
            gc.collect()
        assert [str(w.message) for w in seen if "never awaited" in str(w.message)] == []

    async def main(b: S3Backend) -> None:
        nonlocal backend
        backend = b
        sent = Sent(b)
        check(b)
        assert sent.requests == []
        await b.awrite_ref("refs/t", b"x", None)  # the async face still works

    _run(main, moto_server)
    assert backend is not None
    check(backend)


def test_cancelling_aget_many_mid_flight(moto_server: dict[str, Any]) -> None:
    """An aget_many cancelled while its GETs are in flight raises CancelledError (not a
    StorageError) and leaves no request running; so does a first write cancelled during the
    probe. The backend then reads, probes and writes as usual."""
    async def main(b: S3Backend) -> None:
        objects = {f"packs/{i}": bytes([i]) * 100 for i in range(64)}
        await b.aput_many(objects)
        sent = Sent(b)
        started = asyncio.Event()
        sent.on_send = started.set
        task = asyncio.ensure_future(b.aget_many(objects))
        await started.wait()
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()
        after = len(sent.requests)
        assert 0 < after < 64
        await asyncio.sleep(0.3)
        assert len(sent.requests) == after  # nothing left running in the background
        assert await b.aget_many(objects) == objects
        await b.awrite_ref("refs/t", b"x", None)

    async def cancel_the_probe(b: S3Backend) -> None:
        sent = Sent(b)
        started = asyncio.Event()
        sent.on_send = started.set
        first = asyncio.ensure_future(b.awrite_ref("refs/t", b"x", None))
        waiting = [asyncio.ensure_future(b.awrite_ref(f"refs/w{i}", b"w", None))
                   for i in range(5)]
        await started.wait()
        assert len(sent.probes()) == 1
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        versions = await asyncio.gather(*waiting)  # another waiter probes, then all write
        assert all(isinstance(v, str) for v in versions)
        assert await b.aread_ref("refs/t") is None  # the cancelled write never landed
        assert await b.awrite_ref("refs/t", b"x", None)
        assert len(sent.probes()) == 2

    _run(main, moto_server)
    _run(cancel_the_probe, moto_server)


def test_async_face_of_a_sync_backend_runs_the_sync_method_on_a_thread(
        moto_server: dict[str, Any]) -> None:
    """An S3Backend over a sync S3FileSystem (client bound to fsspec's own loop) used from
    asyncio: each call runs the sync method on the backend's thread pool, so its requests go
    out on fsspec's loop, never on the caller's; and they work."""
    b = open_backend(_url(moto_server), moto_server["storage_options"])
    assert isinstance(b, S3Backend) and not b.asynchronous

    async def main() -> None:
        sent = Sent(b)
        await b.aput_many({"packs/a": b"a"})
        assert await b.aget_many(["packs/a", "packs/b"]) == {"packs/a": b"a", "packs/b": None}
        v = await b.awrite_ref("refs/t", b"x", None)
        assert await b.aread_refs(["refs/t"]) == [(b"x", v)] == [await b.aread_ref("refs/t")]
        assert [i.key for i in await b.alist_many(["packs", "refs"])] == ["packs/a", "refs/t"]
        assert [i.key for i in await b.alist("refs")] == ["refs/t"]
        await b.adelete_ref("refs/t", v)
        assert await b.adelete_many(["packs/a"]) == []
        threads = {ident for _, _, ident in sent.requests}
        assert threads and threading.get_ident() not in threads
        await b.aclose()  # its pool; the fs (shared, fsspec's) stays usable
        assert b.get_many(["packs/a"]) == {"packs/a": None}

    asyncio.run(main())


def test_open_backend_async_for_every_url_kind(moto_server: dict[str, Any],
                                               tmp_path: Any) -> None:
    async def main() -> None:
        local = await open_backend_async(str(tmp_path / "store"))
        assert isinstance(local, LocalBackend)
        mem = await open_backend_async(f"memory://async-{uuid.uuid4().hex[:8]}")
        assert isinstance(mem, MemoryBackend)
        await mem.awrite_ref("refs/t", b"x", None)
        assert (await mem.aread_ref("refs/t") or (b"",))[0] == b"x"
        url = _url(moto_server)
        a = await _open(url, moto_server["storage_options"], timeout=3)
        b = await _open(url, moto_server["storage_options"], timeout=3)
        assert a.fs is not b.fs  # never a cached instance (it could belong to another loop)
        assert a.fs.config_kwargs["read_timeout"] == 3
        await a.awrite_ref("refs/t", b"x", None)
        assert (await b.aread_ref("refs/t") or (b"",))[0] == b"x"
        await a.aclose()
        await b.aclose()
        assert a.fs._s3 is None
        # an asynchronous s3fs made by the caller: backend_for takes it, and does not own it
        import s3fs

        fs = s3fs.S3FileSystem(asynchronous=True, skip_instance_cache=True,
                               **moto_server["storage_options"])
        c = backend_for(fs, url.removeprefix("s3://"))
        assert isinstance(c, S3Backend) and c.asynchronous
        assert (await c.aread_ref("refs/t") or (b"",))[0] == b"x"
        await c.aclose()
        assert fs._s3 is not None  # the caller's to close
        await fs._s3creator.__aexit__(None, None, None)
        with pytest.raises(InvalidArgumentError):
            await open_backend_async("")

    asyncio.run(main())


def test_a_new_async_backend_reads_no_botocore_data_files_again(
        moto_server: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each async backend makes a client of its own (on its loop), in a session of its own:
    the S3 service model and its endpoint rules (botocore's data files, ~0.25 s of JSON) are
    read once a process, not once a backend (each new async saver on S3 paid it before its
    first request). The client still works, and a profile given is still the session's."""
    from botocore.loaders import JSONFileLoader

    real = JSONFileLoader.load_file
    read: list[str] = []

    def counted(self: Any, file_path: str, *a: Any, **k: Any) -> Any:
        read.append(file_path)
        return real(self, file_path, *a, **k)

    monkeypatch.setattr(JSONFileLoader, "load_file", counted)

    async def put_get(backend: S3Backend) -> bytes:
        await backend.aput_many({"k/one": b"1"})
        return (await backend.aget_many(["k/one"]))["k/one"] or b""

    assert _run(put_get, moto_server) == b"1"
    first = len(read)
    assert _run(put_get, moto_server) == b"1"
    assert len(read) == first, read[first:]
