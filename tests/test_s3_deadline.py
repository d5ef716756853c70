"""An S3 endpoint that accepts connections and never answers, or answers and then stalls in the
middle of a body, fails a storage call with a StorageError naming the endpoint, after
``retries`` attempts of ``timeout`` each: no hidden botocore or s3fs retries on top (they made
25 attempts of each request). Counted in the requests the server saw; each call also runs under
a generous wall-clock cap, a hang guard only (a loaded machine may be slow, never 5x slow)."""

from __future__ import annotations

import asyncio
import copy
import itertools
import os
import select
import socket
import socketserver
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _faultproxy import FaultProxy

from cas_checkpoint import CheckpointStore, InvalidArgumentError, StorageError
from cas_checkpoint.aio import AsyncCheckpointStore
from cas_checkpoint.cli import main

_NOT_FOUND = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchKey</Code><Message>'
              b"The specified key does not exist.</Message></Error>")


class Stalling:
    """An HTTP server on 127.0.0.1 that reads each request and then, by ``mode``: ``silent``
    never answers; ``midbody`` sends the head of a 200 reply and 10 of its 100 body bytes,
    then nothing; ``missing`` answers 404 NoSuchKey (an endpoint that works). A stalled
    connection is held until the client closes it."""

    def __init__(self, mode: str = "silent") -> None:
        self.mode = mode
        self.requests = 0
        self.lock = threading.Lock()
        self._closing = threading.Event()
        server = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                try:
                    server._handle(self.request)
                except OSError:
                    pass

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 128

        self.server = Server(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _handle(self, sock: socket.socket) -> None:
        f = sock.makefile("rb")
        while True:  # keep-alive: one connection may carry several requests
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                line = f.readline(65537)
                if not line:
                    return
                head += line
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            f.read(length)
            with self.lock:
                self.requests += 1
                mode = self.mode
            if mode == "missing":
                sock.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/xml\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(_NOT_FOUND), _NOT_FOUND))
                continue
            if mode == "midbody":
                sock.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\nETag: "0a"\r\n'
                             b"Content-Type: binary/octet-stream\r\n\r\n" + b"x" * 10)
            while not self._closing.is_set():  # say nothing until the client gives up
                ready, _, _ = select.select([sock], [], [], 0.1)
                if ready and not sock.recv(65536):
                    return

    def close(self) -> None:
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stalling() -> Iterator[Stalling]:
    server = Stalling()
    yield server
    server.close()


def _options(endpoint: str) -> dict[str, Any]:
    return {"key": "testing", "secret": "testing", "use_listings_cache": False,
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}


def _within(cap: float, call: Callable[[], Any]) -> BaseException | None:
    """Run ``call`` in a thread; the exception it raised (None if it returned). Fails the test
    if it is still running after ``cap`` seconds: the deadline did not hold."""
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            out.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    start = time.monotonic()
    worker.start()
    worker.join(cap)
    assert out, f"the call was still running after {time.monotonic() - start:.0f} s"
    return out[0]


def test_an_endpoint_that_never_answers_fails_once_naming_it(stalling: Stalling) -> None:
    """Old code: botocore's 5 attempts x s3fs's 5, each waiting the full timeout (25 requests
    and over a minute with timeout=1; 114 s with timeout=3)."""
    store = CheckpointStore.open("s3://cas-test/never", storage_options=_options(
        stalling.endpoint), timeout=1, retries=3)
    err = _within(20, lambda: store.save("t", {"a": 1}))
    assert isinstance(err, StorageError), err
    assert stalling.endpoint in str(err) and "did not answer within 1 s" in str(err)
    assert "timeout=" in str(err) and "--timeout" in str(err)
    assert stalling.requests == 1  # it never answered: not retried


def test_the_async_face_fails_the_same_way(stalling: Stalling) -> None:
    async def go() -> None:
        store = await AsyncCheckpointStore.open(
            "s3://cas-test/never", storage_options=_options(stalling.endpoint), timeout=1,
            retries=3)
        try:
            await store.save("t", {"a": 1})
        finally:
            await store.aclose()

    err = _within(20, lambda: asyncio.run(go()))
    assert isinstance(err, StorageError), err
    assert stalling.endpoint in str(err) and "did not answer within 1 s" in str(err)
    assert stalling.requests == 1


@pytest.mark.parametrize("retries", [1, 3])
def test_an_endpoint_that_answered_then_stalls_midbody_gets_retries_attempts(
        stalling: Stalling, retries: int) -> None:
    """The endpoint answered once (a thread that does not exist), then each reply stops after
    10 of its 100 bytes: ``retries`` requests, each cut by the read timeout."""
    stalling.mode = "missing"
    store = CheckpointStore.open(f"s3://cas-test/{uuid.uuid4().hex[:8]}",
                                 storage_options=_options(stalling.endpoint), timeout=1,
                                 retries=retries)
    assert store.head("t") is None and stalling.requests >= 1
    before, stalling.mode = stalling.requests, "midbody"
    err = _within(5 * retries + 15, lambda: store.head("t"))
    assert isinstance(err, StorageError), err
    assert stalling.endpoint in str(err) and f"after {retries} attempts" in str(err)
    assert "retries=" in str(err) and "--retries" in str(err)
    assert stalling.requests - before == retries


def test_a_ref_write_that_stalls_spends_retries_requests(moto_server: dict[str, Any]) -> None:
    """A save whose ref PUT stalls, and every request after it: the PUT and the re-read that
    checks whether it landed draw on the same ``retries`` attempts (old code: the re-read made
    ``retries`` more of its own, each of them 25 with botocore's and s3fs's retries)."""
    proxy = FaultProxy(moto_server["endpoint"], stall=60)
    try:
        opts = copy.deepcopy(moto_server["storage_options"])
        opts["client_kwargs"]["endpoint_url"] = proxy.endpoint
        store = CheckpointStore.open(f"s3://cas-test/{uuid.uuid4().hex[:8]}",
                                     storage_options=opts, timeout=1, retries=3)
        store.save("t", {"a": 1})
        before = proxy.requests
        proxy.every, proxy._cycle = 1, itertools.cycle(["stall"])
        err = _within(30, lambda: store.save("t", {"a": 2}))
        assert isinstance(err, StorageError), err
        assert proxy.endpoint in str(err) and "after 3 attempts" in str(err)
        assert proxy.requests - before == 3, proxy.requests - before
    finally:
        proxy.close()


def test_the_command_line_fails_within_its_deadline(stalling: Stalling) -> None:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    proc = subprocess.run(
        [sys.executable, "-m", "cas_checkpoint.cli", "threads", "s3://cas-test/never",
         "--endpoint-url", stalling.endpoint, "--region", "us-east-1", "--timeout", "1",
         "--retries", "2"], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2, proc.stderr
    assert stalling.endpoint in proc.stderr and "--timeout" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert stalling.requests == 1


@pytest.mark.parametrize(("args", "flag"), [
    (["--timeout", "0"], "--timeout"), (["--timeout", "soon"], "--timeout"),
    (["--timeout", "nan"], "--timeout"), (["--timeout", "inf"], "--timeout"),
    (["--retries", "0"], "--retries"), (["--retries", "101"], "--retries"),
    (["--retries", "2.5"], "--retries"),
])
def test_bad_deadline_flags_are_usage_errors(capsys: pytest.CaptureFixture[str],
                                             args: list[str], flag: str) -> None:
    assert main(["threads", "memory://x", *args]) == 2
    err = capsys.readouterr().err
    assert f"argument {flag}:" in err and "write e.g." in err, err


def test_help_documents_the_deadline_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["threads", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--timeout SECONDS" in out and "--retries N" in out and "default 30" in out


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), True, "3"])
def test_the_api_refuses_a_timeout_that_is_no_bound(timeout: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="timeout"):
        CheckpointStore.open("memory://deadline", timeout=timeout)
