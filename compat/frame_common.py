"""What the framework suites (compat/adk_suite.py, compat/agents_suite.py) share: a conftest
that runs ``async def`` tests without pytest-asyncio and records every outcome, running pytest
on a prepared copy of a framework's tests, and a table of pass counts per backend."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

CONFTEST = '''
import asyncio, inspect, json, os
import pytest

_RESULTS = os.environ["CAS_FRAME_RESULTS"]


def pytest_configure(config):
    config.addinivalue_line("markers", "asyncio: an async test (run by this conftest)")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if pyfuncitem.config.pluginmanager.hasplugin("asyncio"):
        return None
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        names = pyfuncitem._fixtureinfo.argnames
        asyncio.run(pyfuncitem.obj(**{n: pyfuncitem.funcargs[n] for n in names}))
        return True
    return None


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        with open(_RESULTS, "a", encoding="utf-8") as f:
            f.write(json.dumps({"nodeid": report.nodeid, "when": report.when,
                                "outcome": report.outcome,
                                "message": str(report.longrepr)[-600:]
                                if report.failed else ""}) + "\\n")
'''


def run_pytest(work: Path, files: list[str], *, timeout: float, verbose: bool,
               extra_env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Run ``files`` (relative to ``work``) with the recording conftest; one line a phase."""
    results = work / "results.jsonl"
    results.unlink(missing_ok=True)
    (work / "conftest.py").write_text(CONFTEST, encoding="utf-8")
    # asyncio_mode: newer framework tests have async fixtures (needs pytest-asyncio; without
    # it, the conftest above runs async tests and the key is ignored)
    (work / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n"
                                     "asyncio_mode = auto\n")
    env = dict(os.environ, CAS_FRAME_RESULTS=str(results), **(extra_env or {}),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "pytest", "-q", "--tb=short" if verbose else "--tb=no",
           "-p", "no:randomly", *files]
    got = subprocess.run(cmd, cwd=work, env=env, capture_output=not verbose, text=True,
                         timeout=timeout)
    if got.returncode not in (0, 1):
        raise RuntimeError(f"pytest exited {got.returncode}: "
                           f"{(got.stdout or '')[-2000:]}{(got.stderr or '')[-2000:]}")
    if not results.exists():
        return []
    return [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines()]


def by_backend(lines: list[dict[str, Any]], backends: list[str]
               ) -> dict[str, dict[str, str]]:
    """backend -> test name -> passed/failed/skipped (a test's backend is its parameter)."""
    out: dict[str, dict[str, str]] = defaultdict(dict)
    for line in lines:
        m = re.search(r"\[([^\]]*)\]$", line["nodeid"])
        params = m.group(1).split("-") if m else []
        backend = next((b for b in backends if b in params), None)
        if backend is None:
            continue
        name = re.sub(r"\[[^\]]*\]$", "", line["nodeid"]) + \
            "[" + "-".join(p for p in params if p != backend) + "]"
        now = line["outcome"]
        if out[backend].get(name) != "failed":
            out[backend][name] = now
    return out


def table(results: dict[str, dict[str, str]], backends: list[str]) -> str:
    rows = ["| backend | passed | failed | skipped |", "|---|---|---|---|"]
    for b in backends:
        if not results.get(b):
            continue  # (a backend that did not run)
        c = Counter(results[b].values())
        rows.append(f"| {b} | {c['passed']} | {c['failed']} | {c['skipped']} |")
    return "\n".join(rows)


def only_ours_failed(results: dict[str, dict[str, str]], ours: list[str],
                     theirs: list[str]) -> list[tuple[str, str]]:
    """(backend, test) that fail on one of ours and pass on every one of theirs."""
    bad = []
    for b in ours:
        for name, outcome in results.get(b, {}).items():
            if outcome == "failed" and all(results.get(t, {}).get(name) == "passed"
                                           for t in theirs):
                bad.append((b, name))
    return bad
