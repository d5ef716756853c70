"""Shared fixtures: one store per backend (memory, local, S3 on a moto server over HTTP).

Rule: a test that takes ``store``, ``make_store`` or ``backend_kind`` runs on memory:// and a
local directory; it runs on S3 (s3fs against moto) too only where S3 can show something the
others cannot -- mark it, or its module, ``@pytest.mark.s3_matters("why")``. The storage side
of S3 is ``test_backend_contract.py``'s. ``CAS_TEST_BACKENDS=memory,local,s3`` runs every such
test on the backends listed (e.g. all of them before a release).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cas_checkpoint import CheckpointStore

# the OpenAI Agents SDK (tests/test_openai_agents.py, its guide) exports traces to OpenAI unless
# told not to: no network, and no "OPENAI_API_KEY is not set" line at exit
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

BACKENDS = ["memory", "local", "s3"]
STORE_BACKENDS = ["memory", "local"]  # where store logic runs unless S3 matters (see above)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _atomic_conditional_writes() -> None:
    """moto checks If-Match / If-None-Match and then writes, with no lock between (FACTS.md):
    two concurrent conditional PUTs on one key can both win, and one acknowledged write is
    overwritten. Real S3 decides them atomically; make moto do so too, or a many-writer test
    measures moto's race instead of ours."""
    import threading

    from moto.s3.responses import S3Response

    lock = threading.Lock()
    for name in ("put_object", "delete_object"):
        real = getattr(S3Response, name)
        if getattr(real, "_atomic", False):
            continue

        def atomic(self: Any, _real: Any = real) -> Any:
            if self.headers.get("If-Match") or self.headers.get("If-None-Match"):
                with lock:
                    return _real(self)
            return _real(self)

        atomic._atomic = True  # type: ignore[attr-defined]
        setattr(S3Response, name, atomic)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[dict[str, Any]]:
    """moto in server mode on 127.0.0.1: s3fs talks real HTTP to it."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    _atomic_conditional_writes()
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                 aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket="cas-test")
    try:
        yield {"endpoint": endpoint, "bucket": "cas-test",
               "storage_options": {"key": "testing", "secret": "testing",
                                   "client_kwargs": {"endpoint_url": endpoint,
                                                     "region_name": "us-east-1"},
                                   "use_listings_cache": False}}
    finally:
        server.stop()


class AsyncFace:
    """An ``AsyncCheckpointStore`` driven from sync test code: its coroutines run on an event
    loop in a thread of its own, so the contract tests written for ``CheckpointStore`` run
    unchanged against the async face. ``backend`` is the store's own backend where it has sync
    methods (memory, local); for S3 (whose backend is bound to the loop) it is a sync view that
    awaits the backend's methods on that loop. ``refs``/``objects`` run their steps through
    the async driver, on the store's own objects."""

    def __init__(self, url: str, **kw: Any) -> None:
        import asyncio
        import threading

        from cas_checkpoint.aio import AsyncCheckpointStore
        from cas_checkpoint.engine.steps import arun
        from cas_checkpoint.store import _Blocking

        self._loop = loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, daemon=True)
        self._thread.start()
        self._astore = astore = self._call(AsyncCheckpointStore.open(url, **kw))
        core = astore._core
        sync_ok = not getattr(getattr(core.backend, "fs", None), "asynchronous", False)
        self.backend = core.backend if sync_ok else _SyncView(core.backend, self._call)
        self.types, self.keep_last = core.types, core.keep_last

        def runner(step: Any) -> Any:
            return self._call(arun(step, core.backend))

        self.refs = _Blocking(core.refs, core.backend, runner)
        self.objects = _Blocking(core.objects, core.backend, runner)

    def _call(self, coro: Any) -> Any:
        import asyncio

        async def wrapped() -> Any:
            return await coro

        return asyncio.run_coroutine_threadsafe(wrapped(), self._loop).result(timeout=300)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._astore, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kw: Any) -> Any:
            return self._call(attr(*args, **kw))

        return call

    def close(self) -> None:
        self._call(self._astore.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


class _SyncView:
    """Sync calls on an async-only backend, awaited on its loop (for tests that inspect it)."""

    def __init__(self, backend: Any, call: Any) -> None:
        self._backend, self._call = backend, call
        self.url = backend.url

    def __getattr__(self, name: str) -> Any:
        import inspect

        twin = getattr(self._backend, "a" + name, None)
        if twin is None or not inspect.iscoroutinefunction(twin):
            return getattr(self._backend, name)
        return lambda *a, **kw: self._call(twin(*a, **kw))

    def get(self, key: str) -> bytes:
        from cas_checkpoint.errors import NotFoundError

        data = self.get_many([key])[key]
        if data is None:
            raise NotFoundError(f"{key} does not exist")
        return data  # type: ignore[no-any-return]


_FACES: list[AsyncFace] = []


@pytest.fixture(autouse=True, scope="module")
def _empty_memory_filesystem() -> Iterator[None]:
    """Each test module's ``memory://`` stores are gone after it: the in-memory filesystem is
    one dict for the whole process, and listing any store in it walks every key of every store
    (fsspec's ``MemoryFileSystem.find``), so the last modules of the suite listed hundreds of
    thousands of keys the earlier ones left (the store fuzz slowed to minutes)."""
    yield
    from fsspec.implementations.memory import MemoryFileSystem

    MemoryFileSystem.store.clear()
    MemoryFileSystem.pseudo_dirs[:] = [""]


@pytest.fixture(autouse=True, scope="session")
def _close_async_faces() -> Iterator[None]:
    yield
    for face in _FACES:
        try:
            face.close()
        except Exception:
            pass


def open_store(kind: str, tmp_path: Any, request: pytest.FixtureRequest,
               **kw: Any) -> CheckpointStore:
    name = uuid.uuid4().hex[:12]
    if kind.endswith("-async"):
        base = kind.removesuffix("-async")
        if base == "memory":
            url = f"memory://cas-{name}"
        elif base == "local":
            url = str(tmp_path / f"store-{name}")
        else:
            server = request.getfixturevalue("moto_server")
            url = f"s3://{server['bucket']}/{name}"
            kw.setdefault("storage_options", server["storage_options"])
        face = AsyncFace(url, **kw)
        _FACES.append(face)
        return face  # type: ignore[return-value]
    if kind == "memory":
        return CheckpointStore.open(f"memory://cas-{name}", **kw)
    if kind == "local":
        return CheckpointStore.open(str(tmp_path / f"store-{name}"), **kw)
    server = request.getfixturevalue("moto_server")
    return CheckpointStore.open(f"s3://{server['bucket']}/{name}",
                                storage_options=server["storage_options"], **kw)


def _store_backends(metafunc: pytest.Metafunc) -> list[str]:
    listed = os.environ.get("CAS_TEST_BACKENDS", "")
    kinds = [k.strip() for k in listed.split(",") if k.strip()] or list(STORE_BACKENDS)
    unknown = [k for k in kinds if k not in BACKENDS]
    if unknown:
        raise pytest.UsageError(f"CAS_TEST_BACKENDS names {unknown}: list some of {BACKENDS}, "
                                "separated by commas")
    mark = metafunc.definition.get_closest_marker("s3_matters")
    if mark is not None:
        if not (mark.args and isinstance(mark.args[0], str) and mark.args[0].strip()):
            raise pytest.UsageError(f"{metafunc.definition.nodeid}: s3_matters needs a reason: "
                                    "@pytest.mark.s3_matters(\"what only S3 shows\")")
        if "s3" not in kinds:
            kinds.append("s3")
    return kinds


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``backend_kind`` for the tests that take it and do not list their own kinds."""
    if "backend_kind" not in metafunc.fixturenames:
        return
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0]
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if "backend_kind" in names:
            return  # the test lists its own kinds
    face = getattr(metafunc.module, "FACE", "")  # "-async": the async face of each kind
    metafunc.parametrize("backend_kind", [k + face for k in _store_backends(metafunc)],
                         indirect=True)


@pytest.fixture
def backend_kind(request: pytest.FixtureRequest) -> str:
    """memory or local (s3 too where marked ``s3_matters``): see the module's docstring. A
    module whose ``FACE = "-async"`` gets each kind's async face (``test_async_contract``)."""
    return str(request.param)


@pytest.fixture
def store(backend_kind: str, tmp_path: Any, request: pytest.FixtureRequest) -> CheckpointStore:
    return open_store(backend_kind, tmp_path, request)


@pytest.fixture
def make_store(backend_kind: str, tmp_path: Any, request: pytest.FixtureRequest) -> Any:
    """Open another store of the same kind (e.g. with registered types)."""
    def make(**kw: Any) -> CheckpointStore:
        return open_store(backend_kind, tmp_path, request, **kw)
    return make
