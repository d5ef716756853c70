"""Builders the tests share: messages and states, a store's storage options, and the command
line run in-process (one real subprocess is enough for the entry point: test_cli.py)."""

from __future__ import annotations

import contextlib
import io
import os
import random
import subprocess
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from cas_checkpoint import CheckpointStore
from cas_checkpoint.cli import main

S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
          "AWS_DEFAULT_REGION": "us-east-1"}


def msg(i: int, text: str = "lorem ipsum dolor sit amet ", times: int = 8,
        prefix: str = "message") -> dict[str, Any]:
    """A chat message, different for every ``i``: ``{prefix} {i}: `` and ``text`` ``times``
    times (roles alternate)."""
    return {"role": "user" if i % 2 else "assistant", "content": f"{prefix} {i}: " + text * times}


def random_msg(i: int) -> dict[str, Any]:
    """A message of 60 random five-letter runs (seeded by ``i``): text that compresses but does
    not repeat from one message to the next."""
    rng = random.Random(i)
    return {"role": "user", "content": " ".join(rng.choice("abcdefgh") * 5 for _ in range(60)),
            "id": i}


def options(store: CheckpointStore) -> dict[str, Any] | None:
    """The storage options that reach ``store``'s storage again (an S3 store's endpoint and
    credentials; None elsewhere), to open a second store object on it."""
    fs = getattr(store.backend, "fs", None)
    if fs is None or not store.url.startswith("s3"):
        return None
    # a store opened for asyncio has an async s3fs: open the sync twin without those options
    return {k: v for k, v in fs.storage_options.items()
            if k not in ("asynchronous", "loop", "skip_instance_cache")}


@contextlib.contextmanager
def environment(env: Mapping[str, str | None] | None) -> Iterator[None]:
    """``os.environ`` with ``env`` set for the block (a ``None`` value unsets its variable)."""
    saved = {name: os.environ.get(name) for name in env or {}}
    try:
        _set(env or {})
        yield
    finally:
        _set(saved)  # only the variables set here: other threads may read the environment


def _set(env: Mapping[str, str | None]) -> None:
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run_cli(*argv: str, env: Mapping[str, str | None] | None = None, terminal: bool = False
            ) -> tuple[int, str, str]:
    """``cas-checkpoint ARGV`` in this process: (exit code, stdout, stderr). ``terminal``: a
    stderr that says it is a terminal (progress bars draw on it)."""
    out, err = io.StringIO(), (_Terminal() if terminal else io.StringIO())
    with environment(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def run_cli_proc(*argv: str, env: Mapping[str, str | None] | None = None
                 ) -> subprocess.CompletedProcess[str]:
    """``run_cli`` answered as ``subprocess.run`` would (``returncode``, ``stdout``,
    ``stderr``), for tests written against a process."""
    code, out, err = run_cli(*argv, env=env)
    return subprocess.CompletedProcess(["cas-checkpoint", *argv], code, out, err)


def run_json(*argv: str, env: Mapping[str, str | None] | None = None) -> Any:
    """``cas-checkpoint ARGV --json``, which must succeed, parsed."""
    import json

    code, out, err = run_cli(*argv, "--json", env=env)
    assert code == 0, err
    return json.loads(out)


def count_s3(store: CheckpointStore) -> Counter[str]:
    """Count the S3 requests the store's backend sends, by API call."""
    fs = store.backend.fs  # type: ignore[attr-defined]
    calls: Counter[str] = Counter()
    real = fs._call_s3

    async def counting(method: str, *a: Any, **kw: Any) -> Any:
        calls[method] += 1
        return await real(method, *a, **kw)

    fs._call_s3 = counting
    return calls


def present_bytes(paths: Iterable[Any]) -> int:
    """The bytes of the files among ``paths`` still there (a writer deletes the packs its
    merges replaced just after a save answers: one listed may be gone by now)."""
    out = 0
    for p in paths:
        try:
            out += os.stat(p).st_size
        except FileNotFoundError:
            pass
    return out


def count_calls(monkeypatch: Any, cls: type, names: Iterable[str]) -> Counter[str]:
    """Calls of these methods of ``cls`` from here on, by name (each still runs)."""
    calls: Counter[str] = Counter()
    for name in names:
        real = getattr(cls, name)

        def counted(self: Any, *a: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            calls[_name] += 1
            return _real(self, *a, **kw)
        monkeypatch.setattr(cls, name, counted)
    return calls
