"""benchmarks/bench_agent_app.py at a tiny size, so it cannot rot: 3 turns of the agent on
CasSaver (local disk) and AsyncSqliteSaver, each case in its own process as the benchmark runs
them. Counts only, never times."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cas_checkpoint

pytest.importorskip("langgraph.checkpoint.sqlite.aio")

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_agent_app.py"
PACKAGE_ROOT = Path(cas_checkpoint.__file__).resolve().parent.parent  # the package under test


def test_bench_agent_app_tiny(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")])}
    got = subprocess.run([sys.executable, str(BENCH), "--turns", "3", "--savers",
                          "sqlite-async,cas-local", "--fsyncs", "python", "--json", str(out)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    for heading in ("calls/turn get/put/writes", "after gc/VACUUM (files)",
                    "ratio to AsyncSqliteSaver"):
        assert heading in got.stdout
    results = {r["saver"]: r for r in json.loads(out.read_text())}
    assert set(results) == {"sqlite-async", "cas-local"}
    for r in results.values():
        assert r["turns"] == 3 and r["messages"] == 6  # two messages a turn
        # the graph's shape, whatever the saver: the subgraph's namespace has its own
        # aget_tuple; 15 + 2 parent checkpoints and 2 + 2 of the subgraph; 16 + 3 task writes
        assert r["calls_per_turn"] == [[2, 21, 19]] * 3
        assert len(r["turn_times"]) == len(r["write_times"]) == 3
        assert r["files_running"] >= 1 and 0 < r["bytes_gc"] <= r["bytes_running"]
        assert r["s3_per_turn"] is None
    cas = results["cas-local"]
    assert cas["fsyncs"] > 0  # counted in Python: CasSaver's own os.fsync/os.fdatasync calls
    assert cas["files_gc"] <= cas["files_running"]
    assert results["sqlite-async"]["fsyncs"] is None  # SQLite's C-level fsyncs are not seen
