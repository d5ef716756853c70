"""Run LangGraph's own checkpointer tests on CasSaver, beside InMemorySaver and SqliteSaver.

    python compat/langgraph_suite.py                      # every file that uses a checkpointer
    python compat/langgraph_suite.py --subset ci          # the files tests/test_lg_suite.py runs
    python compat/langgraph_suite.py --files test_interruption.py --backends cas_local

It takes the ``tests/`` folder of the sdist of the *installed* langgraph (downloaded with
``pip download --no-binary :all: --no-deps langgraph==<version>`` unless ``--sdist`` names a
tarball or an unpacked sdist), copies it to a temporary folder, appends
``compat/lg_fixtures.py`` to its ``conftest.py`` (LangGraph's ``sync_checkpointer`` and
``async_checkpointer`` fixtures, re-defined to also hand out CasSaver on a fresh local folder
and a unique ``memory://`` name per test), runs the chosen files with pytest (and
pytest-xdist), then once more with ``LANGGRAPH_STRICT_MSGPACK=true`` on InMemorySaver and
SqliteSaver alone (the strict reference), and prints per-file pass counts for every saver.

A *CasSaver-only failure* is a run that fails on a CasSaver backend but passes on both
InMemorySaver and SqliteSaver (any CasSaver failure, when ``--backends`` names neither); it is
*allowed* when the same run also fails on one of them in strict mode. The exit status is 1
when any CasSaver-only failure is not allowed, 2 when LangGraph's tests are unavailable.
Needs the ``compat`` extra: ``pip install -e '.[compat]'``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CAS = ("cas_local", "cas_memory")
REFERENCE = ("memory", "sqlite")
# a representative subset (about 30 s on two busy cores): DeltaChannel, interruption,
# subgraph persistence and migration
CI_FILES = ("test_delta_channel_exit_mode.py", "test_delta_channel_fork.py",
            "test_delta_channel_parallel_order.py", "test_delta_channel_subgraph.py",
            "test_delta_channel_to_plain.py", "test_delta_channel_update_state.py",
            "test_interruption.py", "test_subgraph_persistence.py",
            "test_subgraph_persistence_async.py", "test_checkpoint_migration.py")


class SuiteUnavailable(RuntimeError):
    """LangGraph's sdist could not be found or downloaded."""


def installed_version() -> str:
    return importlib.metadata.version("langgraph")


def sdist_tests(sdist: str | None, cache: Path) -> Path:
    """The ``tests`` folder of LangGraph's sdist: of ``sdist`` (a .tar.gz or an unpacked
    folder), or of the installed version's, downloaded into ``cache`` once."""
    version = installed_version()
    if sdist is None:
        unpacked = cache / f"langgraph-{version}"
        if not (unpacked / "tests").is_dir():
            cache.mkdir(parents=True, exist_ok=True)
            tarball = cache / f"langgraph-{version}.tar.gz"
            if not tarball.exists():
                got = subprocess.run(
                    [sys.executable, "-m", "pip", "download", "--no-binary", ":all:",
                     "--no-deps", f"langgraph=={version}",
                     "-d", str(cache)], capture_output=True, text=True, timeout=300)
                if got.returncode != 0 or not tarball.exists():
                    raise SuiteUnavailable(f"pip download langgraph=={version} failed: "
                                           f"{(got.stderr or got.stdout).strip()[-300:]}")
            sdist = str(tarball)
        else:
            sdist = str(unpacked)
    path = Path(sdist)
    if path.is_file():
        dest = cache / path.name.removesuffix(".tar.gz")
        if not (dest / "tests").is_dir():
            with tarfile.open(path) as tar:
                tar.extractall(cache, filter="data")
        path = dest
    if not (path / "tests" / "conftest.py").is_file():
        raise SuiteUnavailable(f"{path} holds no tests/conftest.py: pass --sdist with "
                               "LangGraph's sdist (a .tar.gz or its unpacked folder)")
    return path / "tests"


def checkpointer_files(tests: Path) -> list[str]:
    return sorted(p.name for p in tests.glob("test_*.py")
                  if "sync_checkpointer" in (text := p.read_text(encoding="utf-8"))
                  or "async_checkpointer" in text)


def prepare(tests: Path, work: Path) -> Path:
    """A copy of ``tests`` in ``work`` with our fixtures appended to its conftest."""
    dest = work / "tests"
    shutil.copytree(tests, dest)
    with open(dest / "conftest.py", "a", encoding="utf-8") as f:
        f.write("\n\n" + (HERE / "lg_fixtures.py").read_text(encoding="utf-8"))
    (work / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    return dest


def inner_env(backends: list[str], results: Path, *, strict: bool) -> dict[str, str]:
    """The environment of the pytest run over LangGraph's tests: ours, less what an outer
    pytest-xdist worker set (run from tests/test_lg_suite.py under ``pytest -n 2``, the inner
    controller inherited PYTEST_XDIST_WORKER, took itself for a worker and wrote no results:
    "0 runs")."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PYTEST_XDIST_") and k != "PYTEST_CURRENT_TEST"}
    env.update(NO_DOCKER="true", CAS_LG_BACKENDS=",".join(backends),
               CAS_LG_RESULTS=str(results),
               LANGGRAPH_STRICT_MSGPACK="true" if strict else "false",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return env


def run_pytest(work: Path, files: list[str], backends: list[str], *, strict: bool,
               workers: int, timeout: float, verbose: bool) -> list[dict[str, Any]]:
    results = work / f"results-{'strict' if strict else 'default'}.jsonl"
    results.unlink(missing_ok=True)
    env = inner_env(backends, results, strict=strict)
    cmd = [sys.executable, "-m", "pytest", "-q", "--tb=short" if verbose else "--tb=no",
           "-rN", *[f"tests/{f}" for f in files]]
    if workers > 1:
        cmd[3:3] = ["-n", str(workers)]
    got = subprocess.run(cmd, cwd=work, env=env, capture_output=not verbose, text=True,
                         timeout=timeout)
    if got.returncode not in (0, 1):  # 0 all passed, 1 some failed; else pytest broke
        raise RuntimeError(f"pytest exited {got.returncode}: "
                           f"{(got.stdout or '')[-2000:]}{(got.stderr or '')[-2000:]}")
    if not results.exists():
        return []
    return [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines()]


def outcomes(lines: list[dict[str, Any]], names: dict[tuple[str, str], str] | None = None
             ) -> dict[tuple[str, str], str]:
    """(key, saver) -> passed / failed / skipped, over a run's phases (and into ``names``,
    each run's pytest name)."""
    out: dict[tuple[str, str], str] = {}
    for line in lines:
        k = (line["cas_key"], line["cas_saver"])
        if names is not None:
            names[k] = line["cas_name"]
        now = ("skipped" if line["xfail"] or line["outcome"] == "skipped"
               else line["outcome"])
        before = out.get(k)
        if before == "failed" or (before == "skipped" and now == "passed"):
            continue
        out[k] = now
    return out


def durations(lines: list[dict[str, Any]]) -> dict[str, float]:
    """Seconds per saver (setup, call and teardown, as pytest times them in its workers) over
    the tests every saver of the run ran, so the totals compare the same work."""
    per: dict[tuple[str, str], float] = defaultdict(float)
    for line in lines:
        per[(line["cas_key"], line["cas_saver"])] += float(line.get("duration") or 0.0)
    savers = {s for _k, s in per}
    keys = {k for k, _s in per}
    common = [k for k in keys if all((k, s) in per for s in savers)]
    return {s: sum(per[(k, s)] for k in common) for s in sorted(savers)}


def print_durations(seconds: dict[str, float]) -> None:
    if not seconds:
        return
    refs = [r for r in REFERENCE if seconds.get(r)]
    print("\ntest time per saver (the same tests on each; summed over pytest's workers, so "
          "it depends on the machine's load):")
    for saver, t in seconds.items():
        ratios = ", ".join(f"{t / seconds[r]:.2f}x {r}" for r in refs if r != saver)
        print(f"  {saver:<22} {t:8.1f} s" + (f"  ({ratios})" if ratios else ""))


def report(default: dict[tuple[str, str], str], strict: dict[tuple[str, str], str],
           names: dict[tuple[str, str], str]) -> dict[str, Any]:
    """Per-file counts and the CasSaver-only failures."""
    per: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for (key, saver), outcome in default.items():
        cell = per[key.split("::")[0]][saver]
        cell[1] += 1
        cell[0] += outcome == "passed"
    for (key, saver), outcome in strict.items():
        cell = per[key.split("::")[0]]["strict_" + saver]
        cell[1] += 1
        cell[0] += outcome == "passed"
    cas_only, allowed = [], []
    refs = {s for _k, s in default} & set(REFERENCE)  # (none: every CasSaver failure counts)
    for (key, saver), outcome in sorted(default.items()):
        if saver not in CAS or outcome != "failed":
            continue
        if not all(default.get((key, ref)) == "passed" for ref in refs):
            continue
        if any(strict.get((key, ref)) == "failed" for ref in REFERENCE):
            allowed.append(names.get((key, saver), key))
        else:
            cas_only.append(names.get((key, saver), key))
    return {"files": {f: {s: tuple(c) for s, c in cells.items()} for f, cells in per.items()},
            "cas_only": cas_only, "allowed": allowed}


def print_table(summary: dict[str, Any], columns: list[str]) -> None:
    width = max([len(f) for f in summary["files"]] + [5])
    print(f"{'file':<{width}}  " + "  ".join(f"{c:>15}" for c in columns))
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for name in sorted(summary["files"]):
        cells = summary["files"][name]
        row = []
        for c in columns:
            p, t = cells.get(c, (0, 0))
            totals[c][0] += p
            totals[c][1] += t
            row.append(f"{p}/{t}" if t else "-")
        print(f"{name:<{width}}  " + "  ".join(f"{x:>15}" for x in row))
    print(f"{'total':<{width}}  " + "  ".join(f"{f'{p}/{t}':>15}" for p, t in
                                             (totals[c] for c in columns)))
    print(f"\nCasSaver-only failures (pass on InMemorySaver and SqliteSaver): "
          f"{len(summary['cas_only'])}")
    for line in summary["cas_only"]:
        print("  " + line)
    if summary["allowed"]:
        print(f"allowed (also fail there under LANGGRAPH_STRICT_MSGPACK=true): "
              f"{len(summary['allowed'])}")
        for line in summary["allowed"]:
            print("  " + line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdist", help="LangGraph's sdist (.tar.gz or unpacked folder); default: "
                    "pip download the installed version's")
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "cas-lg-sdist"),
                    help="where a downloaded sdist is kept")
    ap.add_argument("--files", nargs="*", help="test files (default: every file that uses "
                    "a checkpointer fixture)")
    ap.add_argument("--subset", choices=["all", "ci"], default="all")
    ap.add_argument("--backends", default="memory,sqlite,cas_local,cas_memory",
                    help="comma-separated savers: memory, sqlite, sqlite_aes, "
                    "memory_migrate_sends, cas_local, cas_memory")
    ap.add_argument("--no-strict", action="store_true", help="skip the strict reference run")
    ap.add_argument("-n", "--workers", type=int, default=2, help="pytest-xdist workers")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--json", help="write the summary to this file")
    ap.add_argument("-v", "--verbose", action="store_true", help="show pytest's output")
    args = ap.parse_args(argv)
    try:
        tests = sdist_tests(args.sdist, Path(args.cache))
    except SuiteUnavailable as exc:
        print(f"LangGraph's tests are unavailable: {exc}", file=sys.stderr)
        return 2
    files = args.files or (list(CI_FILES) if args.subset == "ci" else checkpointer_files(tests))
    backends = [b for b in args.backends.split(",") if b]
    refs = [b for b in backends if b in REFERENCE]
    with tempfile.TemporaryDirectory(prefix="cas-lg-suite-") as tmp:
        work = Path(tmp)
        prepare(tests, work)
        names: dict[tuple[str, str], str] = {}
        lines = run_pytest(work, files, backends, strict=False, workers=args.workers,
                           timeout=args.timeout, verbose=args.verbose)
        default = outcomes(lines, names)
        strict = {} if args.no_strict or not refs else outcomes(run_pytest(
            work, files, refs, strict=True, workers=args.workers, timeout=args.timeout,
            verbose=args.verbose))
    summary = report(default, strict, names)
    summary["runs"] = len(default)
    summary["version"] = installed_version()
    summary["seconds"] = durations(lines)
    columns = backends + [f"strict_{b}" for b in refs if strict]
    print(f"LangGraph {summary['version']}'s tests, {len(files)} files")
    print_table(summary, columns)
    print_durations(summary["seconds"])
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1), encoding="utf-8")
    return 1 if summary["cas_only"] else 0


if __name__ == "__main__":
    sys.exit(main())
