"""The command line: demo, threads, log (verify has its own tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cas_checkpoint import CheckpointStore
from cas_checkpoint.cli import main


def test_demo_writes_a_store_and_prints_history(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "demo")
    assert main(["demo", url]) == 0
    out = capsys.readouterr().out
    store = CheckpointStore.open(url)
    threads = store.threads()
    assert threads == ["research-agent", "research-agent/what-if", "support-ticket-1042"]
    for thread in threads:
        assert f"thread {thread!r}: {store.count(thread)} checkpoints" in out
        for info in store.history(thread):
            assert info.id[:12] in out
    # the fork starts at the research thread's first answer; the rewind dropped one checkpoint
    fork = store.history("research-agent/what-if")
    assert fork[1].label == "answer-1" and fork[0].label == "what-if"
    assert store.count("support-ticket-1042") == 6
    assert "store size:" in out
    assert main(["demo", url]) == 0  # runs again on the same store
    assert CheckpointStore.open(url).threads() == threads


def test_threads_and_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "s")
    store = CheckpointStore.open(url)
    c1 = store.save("a b/c", {"x": 1}, label="first", tags=["t"], metadata={"k": "v"})
    c2 = store.save("a b/c", {"x": 2})
    assert main(["threads", url]) == 0
    assert capsys.readouterr().out.strip() == "a b/c\t2 checkpoints"
    assert main(["log", url, "a b/c"]) == 0
    out = capsys.readouterr().out
    assert out.index(c2.id[:12]) < out.index(c1.id[:12])
    assert "label=first" in out and "tags=t" in out and "k=v" in out
    assert main(["log", url, "a b/c", "-n", "1"]) == 0
    assert c1.id[:12] not in capsys.readouterr().out


def test_errors_exit_2_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "s")
    CheckpointStore.open(url).save("t", {})
    assert main(["log", url, "missing"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cas-checkpoint: error:") and "'missing'" in err


def test_console_script_entry_point(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "cas_checkpoint.cli", "demo",
                           str(tmp_path / "d")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "research-agent" in proc.stdout


def test_threads_lists_the_healthy_and_names_a_damaged_ref(tmp_path: Any, capsys: Any) -> None:
    from cas_checkpoint import FormatError
    from cas_checkpoint.refs import thread_key

    url = str(tmp_path / "s")
    store = CheckpointStore.open(url)
    for t in ("a", "b", "c"):
        store.save(t, {"t": t})
    path = os.path.join(url, *thread_key("b").split("/"))
    with open(path, "r+b") as f:
        f.write(b"XXXXX")  # its header: not a ref any more
    assert CheckpointStore.open(url).threads() == ["a", "b", "c"]
    with pytest.raises(FormatError, match=r"refs/heads/\w+ of thread 'b' is damaged"):
        CheckpointStore.open(url).count("b")
    assert main(["threads", url]) == 1
    out, err = capsys.readouterr()
    assert "a\t1 checkpoints" in out and "c\t1 checkpoints" in out and "b\t" not in out
    assert "thread 'b'" in err and thread_key("b") in err
