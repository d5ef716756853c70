"""compat/langgraph_suite.py's test time per saver: summed over the tests every saver ran (so
the totals compare the same work), with ratios to InMemorySaver and SqliteSaver."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest


def _suite() -> Any:
    path = Path(__file__).parent.parent / "compat" / "langgraph_suite.py"
    spec = importlib.util.spec_from_file_location("cas_lg_suite", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _line(key: str, saver: str, when: str, seconds: float) -> dict[str, Any]:
    return {"cas_key": key, "cas_saver": saver, "when": when, "duration": seconds,
            "outcome": "passed", "xfail": False}


def test_durations_sum_the_phases_of_the_tests_every_saver_ran(
        capsys: pytest.CaptureFixture[str]) -> None:
    suite = _suite()
    lines = [_line("a", s, w, t) for s, t in (("memory", 1.0), ("sqlite", 2.0),
                                             ("cas_local", 4.0))
             for w in ("setup", "call", "teardown")]
    lines.append(_line("b", "cas_local", "call", 100.0))  # only one saver ran it: left out
    lines.append({k: v for k, v in _line("a", "memory", "call", 0).items() if k != "duration"})
    got = suite.durations(lines)
    assert got == {"cas_local": 12.0, "memory": 3.0, "sqlite": 6.0}
    suite.print_durations(got)
    out = capsys.readouterr().out
    assert "cas_local" in out and "4.00x memory, 2.00x sqlite" in out
    assert "(2.00x memory)" in out and "(0.50x sqlite)" in out  # the references side by side


def test_the_inner_run_is_not_taken_for_an_outer_xdist_worker(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Under ``pytest -n 2`` the harness's own pytest inherited PYTEST_XDIST_WORKER, so its
    controller took itself for a worker and wrote no results (test_lg_suite: "0 runs")."""
    suite = _suite()
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", "abc")
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/test_lg_suite.py::x (call)")
    monkeypatch.setenv("CAS_MARKER", "kept")
    env = suite.inner_env(["cas_local"], tmp_path / "r.jsonl", strict=False)
    assert not [k for k in env if k.startswith("PYTEST_XDIST_") or k == "PYTEST_CURRENT_TEST"]
    assert env["CAS_MARKER"] == "kept" and env["CAS_LG_BACKENDS"] == "cas_local"
    assert env["CAS_LG_RESULTS"] == str(tmp_path / "r.jsonl")
