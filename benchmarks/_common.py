"""Helpers shared by the benchmark scripts: a moto S3 server, workloads, table printing."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

from cas_checkpoint.humanize import human_bytes

human = human_bytes  # "1.5 KB"; the benchmarks import it from here


@contextlib.contextmanager
def moto_s3() -> Iterator[dict[str, Any]]:
    """A moto S3 server on 127.0.0.1 with a bucket ``bench``; yields s3fs storage options."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    for k, v in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench"),
                 ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ.setdefault(k, v)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    import boto3  # type: ignore[import-untyped]

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
        Bucket="bench")
    try:
        yield {"key": "bench", "secret": "bench", "use_listings_cache": False,
               "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
    finally:
        server.stop()


@contextlib.contextmanager
def moto_s3_process(info: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """Like ``moto_s3``, but the server runs in a process of its own (``python -m moto.server``):
    its work and its in-memory bucket stay out of this process (its GIL, its garbage
    collections). Yields s3fs storage options; ``info["pid"]`` is set to the server's pid."""
    for k, v in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench"),
                 ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ.setdefault(k, v)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if info is not None:
        info["pid"] = server.pid
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto server did not start (exit {server.poll()})")
            time.sleep(0.05)
        endpoint = f"http://127.0.0.1:{port}"
        import boto3

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
            Bucket="bench")
        yield {"key": "bench", "secret": "bench", "use_listings_cache": False,
               "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def message(i: int, rng: random.Random, size: int = 380) -> dict[str, Any]:
    """A chat message of about ``size`` encoded bytes."""
    words = " ".join(rng.choice(("agent", "tool", "search", "result", "the", "of", "plan", "step",
                                 "query", "answer")) for _ in range(size // 6))
    return {"role": ("user", "assistant", "tool")[i % 3], "content": words[: max(size - 60, 10)],
            "id": f"msg-{i:06d}"}


def version(name: str) -> str:
    """An installed package's version, or "-" (the benchmarks' header lines)."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "-"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def median(values: list[float]) -> float:
    return statistics.median(values)


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [" | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                        enumerate(zip(r, widths, strict=True))) for r in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


# --- fsyncs counted by strace, sizes of stores (bench_agent_app.py) ----------------------------

FSYNC_MARK_FD = 987654  # never open: an fsync of it fails with EBADF, and strace logs the call
_MARK = re.compile(rf"\bfsync\({FSYNC_MARK_FD}\b")
_SYNC_CALL = re.compile(r"(?<![<\w])(fsync|fdatasync)\(\d")


def strace_works() -> bool:
    """Whether ``strace -f --seccomp-bpf`` runs here (installed, and ptrace allowed)."""
    if shutil.which("strace") is None:
        return False
    try:
        got = subprocess.run(strace_fsyncs(os.devnull) + [sys.executable, "-c", "pass"],
                             capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return got.returncode == 0


def strace_fsyncs(trace: str) -> list[str]:
    """The command prefix that logs every fsync/fdatasync of a process and its threads and
    children to ``trace`` (only those calls stop the process: ``--seccomp-bpf``)."""
    return ["strace", "-f", "--seccomp-bpf", "-e", "trace=fsync,fdatasync", "-o", trace]


def fsync_marker() -> None:
    """A failing fsync that strace logs: put one before and one after what is counted."""
    with contextlib.suppress(OSError):
        os.fsync(FSYNC_MARK_FD)


def count_fsyncs(trace: str) -> int | None:
    """fsync/fdatasync calls between the first two ``fsync_marker`` calls in strace's output
    (None if it has not both)."""
    inside, n, marks = False, 0, 0
    for line in trace.splitlines():
        if _MARK.search(line):
            marks += 1
            inside = marks == 1
        elif inside and _SYNC_CALL.search(line):
            n += 1
    return n if marks >= 2 else None


def tree_size(path: str) -> tuple[int, int]:
    """(bytes, files) under a local folder."""
    n = size = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:  # (a writer deletes the packs its merges replaced just after a save answers)
                size += os.path.getsize(os.path.join(folder, name))
            except FileNotFoundError:
                continue
            n += 1
    return size, n


def s3_size(opts: dict[str, Any], bucket: str, prefix: str) -> tuple[int, int]:
    """(bytes, keys) under a prefix, listed with boto3 (``opts`` as ``moto_s3*`` yields)."""
    import boto3

    s3 = boto3.client("s3", **opts["client_kwargs"])
    n = size = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", ()):
            n, size = n + 1, size + obj["Size"]
    return size, n
