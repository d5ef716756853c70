"""LangGraph's own checkpointer tests pass on CasSaver (issue 28): a representative subset of
them (DeltaChannel, interruption, subgraph persistence, migration: compat/langgraph_suite.py's
CI_FILES) run by the compat harness on CasSaver over a local folder and memory://, from the
sdist of the installed langgraph (``CAS_LG_SDIST`` may name a downloaded one). Skipped when the
sdist cannot be had or the compat extra is not installed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "compat" / "langgraph_suite.py"
NEEDED = ("xdist", "pytest_mock", "syrupy", "redis", "psycopg", "Crypto",
          "langgraph.checkpoint.postgres", "langgraph.checkpoint.sqlite")


def test_langgraph_suite_subset_has_no_cassaver_only_failures(tmp_path: Path) -> None:
    missing = [m for m in NEEDED if importlib.util.find_spec(m.split(".")[0]) is None
               or (m.count(".") and _absent(m))]
    if missing:
        pytest.skip(f"LangGraph's tests need the compat extra (pip install -e '.[compat]'): "
                    f"missing {', '.join(missing)}")
    out = tmp_path / "summary.json"
    cmd = [sys.executable, str(HARNESS), "--subset", "ci", "--backends", "cas_local,cas_memory",
           "--no-strict", "-n", "2", "--json", str(out)]
    if os.environ.get("CAS_LG_SDIST"):
        cmd += ["--sdist", os.environ["CAS_LG_SDIST"]]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT),
                                                       os.environ.get("PYTHONPATH", "")]))
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if got.returncode == 2:
        pytest.skip(f"LangGraph's sdist could not be had: {got.stderr.strip()[-300:]}")
    summary = json.loads(out.read_text()) if out.exists() else None
    assert summary is not None, got.stdout[-3000:] + got.stderr[-3000:]
    assert summary["runs"] > 100, got.stdout[-3000:]  # the files ran, on both backends
    assert summary["cas_only"] == [], got.stdout[-3000:]
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]


def _absent(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:
        return True
