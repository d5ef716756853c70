"""The fast decoder (ormsgpack) on the storage layer's pool threads: the async face of local
disk decodes there, and they start with a stack of their own size (``backends.base._Pool``), so
ormsgpack runs there as on the main thread; hostile input still gives a FormatError. The deep
inputs run in subprocesses: a stack overflow is a SIGSEGV, not an exception."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest

from cas_checkpoint.backends import base
from cas_checkpoint.backends.local import LocalBackend
from cas_checkpoint.format import decoding
from cas_checkpoint.format.codec import decode, encode

pytestmark = pytest.mark.skipif(decoding._accelerator() is None,
                                reason="ormsgpack is not installed")
STATE = {"messages": [{"role": "user", "content": "m" * 100, "n": i} for i in range(100)]}


@pytest.fixture
def fast_calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """One item per ormsgpack call: whether it ran on the main thread."""
    calls: list[bool] = []
    real = decoding._accelerator()
    assert real is not None

    def spy(data: bytes, **kwargs: Any) -> Any:
        calls.append(threading.get_ident() == threading.main_thread().ident)
        return real(data, **kwargs)

    monkeypatch.setattr(decoding, "FAST_UNPACKB", spy)
    monkeypatch.setattr(decoding, "FAST_MIN", 4096)
    return calls


def test_pool_threads_decode_with_ormsgpack(tmp_path: Any, fast_calls: list[bool]) -> None:
    """A state decoded on a local backend's pool thread goes through ormsgpack once (0 times
    on 341e6b3: the main thread only); on a thread of another's making, not at all."""
    data = encode(STATE)
    backend = LocalBackend(str(tmp_path / "s"))
    assert backend.hand_off(decode, data).result() == STATE
    assert fast_calls == [False]
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(decode(data)))
    thread.start()
    thread.join()
    assert got == [STATE] and fast_calls == [False]


def test_a_pool_whose_stack_size_changed_meanwhile_decodes_with_msgpack(
        monkeypatch: pytest.MonkeyPatch, fast_calls: list[bool]) -> None:
    """If the process's stack size is not the pool's when the pool puts it back (another thread
    set it meanwhile), no thread of that pool is vouched for: msgpack decodes there."""
    real = threading.stack_size
    restores: list[int] = []

    def changed(*size: int) -> int:
        got = real(*size)
        if size and size[0] != base.POOL_STACK:  # putting the old size back
            restores.append(size[0])
            return got + 4096  # as if another thread had set its own size meanwhile
        return got

    monkeypatch.setattr(threading, "stack_size", changed)
    pool = base._Pool(2, "test-fast-threads")
    try:
        assert pool.submit(decode, encode(STATE)).result() == STATE
    finally:
        pool.shutdown()
    assert restores and fast_calls == [] and pool._stack == -1


def test_a_pool_with_all_its_threads_leaves_the_stack_size_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Once every thread of the pool has started, a submit neither reads nor sets the
    process's stack size (on the first cut: two calls a submit, each a window in which
    another thread's own setting would be undone), and its threads still decode fast."""
    pool = base._Pool(2, "test-fast-threads-full")
    try:
        gate = threading.Barrier(3)  # both workers busy at once: both threads started
        first = [pool.submit(gate.wait) for _ in range(2)]
        gate.wait()
        for f in first:
            f.result()
        calls: list[tuple[int, ...]] = []
        real = threading.stack_size

        def counted(*size: int) -> int:
            calls.append(size)
            return real(*size)

        monkeypatch.setattr(threading, "stack_size", counted)
        data = encode(STATE)
        assert [pool.submit(decode, data).result() for _ in range(20)] == [STATE] * 20
        assert calls == [], calls
        assert pool._stack == base.POOL_STACK
    finally:
        pool.shutdown()


HOSTILE = r"""
import os, sys, threading
import msgpack
from cas_checkpoint.backends.local import LocalBackend
from cas_checkpoint.errors import FormatError
from cas_checkpoint.format import decoding
from cas_checkpoint.format.codec import MAX_EXT_DEPTH, decode

threading.stack_size(int(sys.argv[1]))  # the program's own small stacks (e.g. musl's 128 KB)
decoding.FAST_MIN = 0
real, calls = decoding.FAST_UNPACKB, []


def spy(data, **kwargs):
    calls.append(len(data))
    return real(data, **kwargs)


decoding.FAST_UNPACKB = spy


def chain(levels, pad):  # extension types inside each other, lists ``pad`` deep in each
    data = msgpack.packb(0)
    for _ in range(levels):
        data = msgpack.packb(msgpack.ExtType(3, b"\x91" * pad + data))
    return data


INPUTS = [  # each as deep as ormsgpack goes (1,024 levels), with work for ext_hook below
    b"\x91" * 100_000,
    b"\x91" * 1022 + chain(MAX_EXT_DEPTH + 5, 1000),
    b"\x81\xa1a" * 1022 + chain(MAX_EXT_DEPTH + 5, 1000),
    b"\x81" * 1022 + b"\x00" * 1023,
    b"\x91" * 1022 + chain(MAX_EXT_DEPTH - 1, 60),  # valid: a value
    chain(MAX_EXT_DEPTH + 5, 1000),
]


def decode_all():
    out = []
    for data in INPUTS:
        try:
            decode(data)
            out.append("value")
        except FormatError:
            out.append("FormatError")
    return out


if sys.argv[2] == "pool":
    got = LocalBackend(sys.argv[3]).hand_off(decode_all).result()
else:  # the control: a thread of that small stack, told it has a large one
    got = []

    def lied():
        decoding.stack_is(decoding.FAST_STACK)
        got.extend(decode_all())

    thread = threading.Thread(target=lied)
    thread.start()
    thread.join()
print(got, len(calls))
"""


def _hostile(where: str, stack: int, tmp_path: Any) -> subprocess.CompletedProcess[str]:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root}
    return subprocess.run([sys.executable, "-c", HOSTILE, str(stack), where, str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=120)


def test_hostile_input_on_a_pool_thread_gives_format_errors(tmp_path: Any) -> None:
    """Inputs nested as deep as ormsgpack goes, with extension types inside each other below,
    decoded by ormsgpack on a pool thread of a program whose threads get 256 KB stacks: a
    FormatError each (a value for the valid one), no crash. On 341e6b3 ormsgpack did not run
    there (0 calls)."""
    proc = _hostile("pool", 256 * 1024, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("] ")[0] + "]" == repr(["FormatError"] * 4 + ["value", "FormatError"])
    assert int(proc.stdout.split("] ")[1]) >= 6  # each input went through ormsgpack


def test_the_same_input_on_a_small_stack_would_crash(tmp_path: Any) -> None:
    """The control: the same inputs through ormsgpack on a thread of 256 KB (told it had more)
    kill the process with SIGSEGV; that is why only threads of a known stack use it."""
    proc = _hostile("lied", 256 * 1024, tmp_path)
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, proc.stdout, proc.stderr[-500:])
