"""Run the OpenAI Agents SDK's own session tests on CasSession, beside its SQLiteSession.

    python compat/agents_suite.py                      # the installed version's sdist
    python compat/agents_suite.py --sdist openai_agents-0.24.0.tar.gz

It takes the ``tests/`` folder of the sdist of the *installed* openai-agents (downloaded with
``pip download --no-binary :all: --no-deps openai-agents==<version>`` unless ``--sdist`` names
a tarball or an unpacked sdist), copies it to a temporary folder and runs
``tests/memory/test_session.py`` three times: as it is (``SQLITE``: the SDK's SQLiteSession),
then with the module's name ``SQLiteSession`` bound to a subclass of ``CasSession`` taking the
same arguments (``CAS_LOCAL``: a store in a folder beside the test's database path, shared by
the sessions of one path as a database file is; ``CAS_MEMORY``: a ``memory://`` store per
path). Nothing else in their file changes.

Tests that reach into SQLite itself (they use the ``sqlite3`` module, write rows behind the
session's back, count its connections or call its private methods) test that backend, not the
``Session`` protocol: they are listed as *SQLite-internal* and not counted for ours. The exit
status is 1 when a protocol test fails on one of ours and passes on SQLITE, 2 when the SDK's
tests are unavailable.
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from frame_common import run_pytest  # noqa: E402

FILE = "tests/memory/test_session.py"
BACKENDS = ["SQLITE", "CAS_LOCAL", "CAS_MEMORY"]

SHIM = '''
# --- added by compat/agents_suite.py: SQLiteSession is CasSession on CAS_AGENTS_BACKEND ---
import hashlib as _cas_hashlib
import os as _cas_os
import uuid as _cas_uuid

if _cas_os.environ.get("CAS_AGENTS_BACKEND"):
    from cas_checkpoint.integrations.openai_agents import CasSession as _CasSession

    class SQLiteSession(_CasSession):  # type: ignore[no-redef]
        def __init__(self, session_id, db_path=":memory:", sessions_table="agent_sessions",
                     messages_table="agent_messages", session_settings=None):
            kind = _cas_os.environ["CAS_AGENTS_BACKEND"]
            if str(db_path) == ":memory:":
                name = _cas_uuid.uuid4().hex
            else:
                name = _cas_hashlib.sha256(str(db_path).encode()).hexdigest()[:16]
            url = (f"memory://agents-{name}" if kind == "CAS_MEMORY"
                   else (str(db_path) + ".cas" if str(db_path) != ":memory:"
                         else _cas_os.path.join(_cas_os.environ["CAS_AGENTS_TMP"], name)))
            super().__init__(session_id, url, session_settings=session_settings)
# --- end ---
'''


class SuiteUnavailable(RuntimeError):
    """The SDK's sdist could not be found or downloaded."""


def installed_version() -> str:
    return importlib.metadata.version("openai-agents")


def sdist_tests(sdist: str | None, cache: Path) -> Path:
    version = installed_version()
    if sdist is None:
        cache.mkdir(parents=True, exist_ok=True)
        tarball = cache / f"openai_agents-{version}.tar.gz"
        if not tarball.exists():
            got = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                 f"openai-agents=={version}", "-d", str(cache)],
                capture_output=True, text=True, timeout=300)
            if got.returncode != 0 or not tarball.exists():
                raise SuiteUnavailable(f"pip download openai-agents=={version} failed: "
                                       f"{(got.stderr or got.stdout).strip()[-300:]}")
        sdist = str(tarball)
    path = Path(sdist)
    if path.is_file():
        dest = cache / path.name.removesuffix(".tar.gz")
        if not (dest / FILE).is_file():
            with tarfile.open(path) as tar:
                tar.extractall(cache, filter="data")
        path = dest
    if not (path / FILE).is_file():
        raise SuiteUnavailable(f"{path} holds no {FILE}: pass --sdist with the SDK's sdist")
    return path / "tests"


def sqlite_internal(text: str) -> set[str]:
    """Tests that reach into SQLite: they use sqlite3, a private name or connections."""
    out = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and \
                node.name.startswith("test_"):
            body = ast.unparse(node)
            if ("sqlite3" in body or "._" in body or "_await_mutation" in body
                    or "connection" in body or "_lock" in body):
                out.add(node.name)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sdist", default=None)
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "cas-agents-sdist"))
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("-k", default=None, help="pytest -k expression (a subset)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    try:
        tests = sdist_tests(args.sdist, Path(args.cache))
    except SuiteUnavailable as e:
        print(f"the Agents SDK's tests are unavailable: {e}")
        return 2
    text = (tests.parent / FILE).read_text(encoding="utf-8")
    internal = sqlite_internal(text)
    results: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="cas-agents-suite-") as tmp:
        work = Path(tmp)
        shutil.copytree(tests, work / "tests")
        marker = "from tests.test_responses import get_text_message\n"
        if marker not in text:
            raise SystemExit(f"{FILE} changed shape: update compat/agents_suite.py")
        (work / FILE).write_text(text.replace(marker, marker + SHIM, 1), encoding="utf-8")
        files = [FILE] + (["-k", args.k] if args.k else [])
        for backend in BACKENDS:
            env = {"CAS_AGENTS_TMP": str(work / "stores")}
            if backend != "SQLITE":
                env["CAS_AGENTS_BACKEND"] = backend
            (work / "stores").mkdir(exist_ok=True)
            lines = run_pytest(work, files, timeout=args.timeout, verbose=args.verbose,
                               extra_env=env)
            got: dict[str, str] = {}
            for line in lines:
                name = line["nodeid"].split("::")[-1]
                if got.get(name) != "failed":
                    got[name] = line["outcome"]
            results[backend] = got

    def base(name: str) -> str:
        return name.split("[")[0]

    print(f"The Agents SDK's {FILE}, openai-agents {installed_version()}:")
    print("| backend | passed | failed | skipped | of which SQLite-internal (not counted) |")
    print("|---|---|---|---|---|")
    for backend in BACKENDS:
        got = results[backend]
        counted = {n: o for n, o in got.items()
                   if backend == "SQLITE" or base(n) not in internal}
        c = {k: sum(1 for o in counted.values() if o == k)
             for k in ("passed", "failed", "skipped")}
        skipped_internal = len(got) - len(counted)
        print(f"| {backend} | {c['passed']} | {c['failed']} | {c['skipped']} | "
              f"{skipped_internal} |")
    bad = [(b, n) for b in BACKENDS[1:] for n, o in results[b].items()
           if o == "failed" and base(n) not in internal
           and results["SQLITE"].get(n) == "passed"]
    for backend, name in bad:
        print(f"FAILED on {backend} only: {name}")
    print("SQLite-internal tests: " + ", ".join(sorted(internal)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
