"""Shared fixtures: one store per backend (memory, local, S3 on a moto server over HTTP)."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cas_checkpoint import CheckpointStore

BACKENDS = ["memory", "local", "s3"]


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


def open_store(kind: str, tmp_path: Any, request: pytest.FixtureRequest,
               **kw: Any) -> CheckpointStore:
    name = uuid.uuid4().hex[:12]
    if kind == "memory":
        return CheckpointStore.open(f"memory://cas-{name}", **kw)
    if kind == "local":
        return CheckpointStore.open(str(tmp_path / f"store-{name}"), **kw)
    server = request.getfixturevalue("moto_server")
    return CheckpointStore.open(f"s3://{server['bucket']}/{name}",
                                storage_options=server["storage_options"], **kw)


@pytest.fixture(params=BACKENDS)
def backend_kind(request: pytest.FixtureRequest) -> str:
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
