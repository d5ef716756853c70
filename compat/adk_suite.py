"""Run Google ADK's own session- and artifact-service tests on CasSessionService and
CasArtifactService, beside ADK's own backends.

    python compat/adk_suite.py                          # tests of the installed ADK's tag
    python compat/adk_suite.py --repo /path/to/adk-python  # a checkout or a bare git dir

ADK's sdist holds no tests, so they come from its repository: ``--repo`` (a checkout, or a
git directory read with ``git show HEAD:<path>``), else ``$CAS_ADK_REPO``, else the tarball of
the tag ``v<installed version>`` from GitHub. ``tests/unittests/sessions/test_session_service.py``
and ``tests/unittests/artifacts/test_artifact_service.py`` are copied to a temporary folder at
run time (never vendored) and changed in these places only:

* every ``@pytest.mark.parametrize('service_type', [...])`` list also names ``CAS_MEMORY`` and
  ``CAS_LOCAL`` (a ``memory://`` store and a local folder, fresh per test);
* ``get_session_service`` / ``get_artifact_service`` hand out our service for those two and
  defer to ADK's own function for the rest;
* ``DatabaseSessionService`` is ADK's SQLAlchemy service when ``google-adk[db]`` is installed,
  else ADK's ``SqliteSessionService`` on a temporary file (the last lines say which); the
  ``GCS`` artifact rows need google-cloud-storage, else they run ADK's ``FileArtifactService``
  (and are counted as ``FILE``).

It prints pass counts per backend; the exit status is 1 when a test fails on one of ours and
passes on all of ADK's, 2 when the tests cannot be found.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from frame_common import by_backend, only_ours_failed, run_pytest, table  # noqa: E402

SESSIONS = "tests/unittests/sessions/test_session_service.py"
ARTIFACTS = "tests/unittests/artifacts/test_artifact_service.py"
FILES = (SESSIONS, ARTIFACTS)
OURS = ["CAS_MEMORY", "CAS_LOCAL"]
THEIRS = ["IN_MEMORY", "DATABASE", "SQLITE", "GCS", "FILE"]

# per file: its enum of backends, its factory function, our service and how a peer that
# needs what is not installed runs instead
SHAPES = {
    SESSIONS: ("SessionServiceType", "get_session_service", "CasSessionService", """
def _cas_peer(t):
    return t.name
"""),
    ARTIFACTS: ("ArtifactServiceType", "get_artifact_service", "CasArtifactService", """
def _cas_has_gcs():
    try:
        import google.cloud.storage  # noqa: F401
        return True
    except ImportError:
        return False


def _cas_peer(t):  # without google-cloud-storage, GCS rows run ADK's FileArtifactService
    return "FILE" if t.name == "GCS" and not _cas_has_gcs() else t.name
"""),
}

PRELUDE = '''
# --- added by compat/adk_suite.py ---
import tempfile as _cas_tempfile
import uuid as _cas_uuid

from cas_checkpoint.integrations.adk import {cls} as _CasService
{peer}
_CAS_TYPES = [pytest.param(t, id=_cas_peer(t)) for t in {enum}] + [
    pytest.param("CAS_MEMORY", id="CAS_MEMORY"), pytest.param("CAS_LOCAL", id="CAS_LOCAL")]
_adk_factory = {getter}


def {getter}(service_type={enum}.IN_MEMORY, *args, **kwargs):
    if service_type == "CAS_MEMORY":
        return _CasService(f"memory://adk-{{_cas_uuid.uuid4().hex}}")
    if service_type == "CAS_LOCAL":
        return _CasService(_cas_tempfile.mkdtemp(prefix="cas-adk-"))
    if _cas_peer(service_type) == "FILE":
        from google.adk.artifacts import FileArtifactService
        return FileArtifactService(_cas_tempfile.mkdtemp(prefix="adk-file-"))
    return _adk_factory(service_type, *args, **kwargs)
# --- end ---

'''

DB_SHIM = '''
def DatabaseSessionService(url, *args, **kwargs):  # compat/adk_suite.py: see DATABASE rows
    try:
        from google.adk.sessions.database_session_service import DatabaseSessionService as D
        return D(url, *args, **kwargs)
    except ImportError:
        import tempfile
        from google.adk.sessions.sqlite_session_service import SqliteSessionService
        return SqliteSessionService(tempfile.mkdtemp() + "/sessions.db")
'''

DB_IMPORT_SHIM = '''
try:
    from google.adk.sessions.database_session_service import DatabaseSessionService
except ImportError:  # compat/adk_suite.py: without sqlalchemy, DATABASE rows run SQLite
    class DatabaseSessionService:  # type: ignore[no-redef]
        def __new__(cls, url, *args, **kwargs):
            import tempfile
            from google.adk.sessions.sqlite_session_service import SqliteSessionService
            return SqliteSessionService(tempfile.mkdtemp() + "/sessions.db")
'''

GCS_SHIM = '''
try:
    from google.adk.artifacts import GcsArtifactService
except ImportError:  # compat/adk_suite.py: GCS rows run FileArtifactService then
    GcsArtifactService = None
'''


class SuiteUnavailable(RuntimeError):
    """ADK's tests could not be found or downloaded."""


def installed_version() -> str:
    return importlib.metadata.version("google-adk")


def read_test(repo: str | None, path: str) -> tuple[str, str]:
    """(text of ``path`` in ADK's repository, where it came from)."""
    if repo:
        p = Path(repo)
        if (p / path).is_file():
            return (p / path).read_text(encoding="utf-8"), f"{p / path}"
        got = subprocess.run(["git", "--git-dir", str(p), "show", f"HEAD:{path}"],
                             capture_output=True, text=True)
        if got.returncode == 0:
            ver = subprocess.run(
                ["git", "--git-dir", str(p), "show", "HEAD:src/google/adk/version.py"],
                capture_output=True, text=True).stdout
            m = re.search(r'__version__ = "([^"]+)"', ver)
            return got.stdout, f"{p} HEAD (ADK {m.group(1) if m else '?'})"
        raise SuiteUnavailable(f"{repo} holds no {path}: pass --repo with ADK's repository")
    tag = f"v{installed_version()}"
    url = f"https://codeload.github.com/google/adk-python/tar.gz/refs/tags/{tag}"
    try:
        data = urllib.request.urlopen(url, timeout=60).read()
    except OSError as e:
        raise SuiteUnavailable(f"cannot download {url} ({e}); pass --repo") from None
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar.getmembers():
            if m.name.split("/", 1)[-1] == path:
                f = tar.extractfile(m)
                assert f is not None
                return f.read().decode("utf-8"), f"{url}"
    raise SuiteUnavailable(f"{url} holds no {path}")


def patch(path: str, text: str) -> str:
    """ADK's test file, with our backends added (see the module docstring)."""
    enum, getter, cls, peer = SHAPES[path]
    text = re.sub(r"^from google\.adk\.sessions import DatabaseSessionService\n", DB_SHIM,
                  text, flags=re.M)
    text = re.sub(r"^from google\.adk\.sessions\.database_session_service import "
                  r"DatabaseSessionService\n", DB_IMPORT_SHIM, text, flags=re.M)
    text = re.sub(r"^from google\.adk\.artifacts import GcsArtifactService\n", GCS_SHIM,
                  text, flags=re.M)
    # newer files: a fixture parametrized over the enum instead of each test
    text = re.sub(r"params=\[[^\]]*" + enum + r"[^\]]*\]", "params=_CAS_TYPES", text)
    text = re.sub(r"([\'\"])service_type\1,\s*\[[^\]]*" + enum + r"[^\]]*\]",
                  "'service_type', _CAS_TYPES", text)
    first = re.search(r"^@pytest", text, flags=re.M)
    if first is None or f"def {getter}" not in text:
        raise SuiteUnavailable(f"ADK's {path} changed shape (no {getter} or no tests): "
                               "update compat/adk_suite.py")
    prelude = PRELUDE.format(cls=cls, peer=peer, enum=enum, getter=getter)
    return text[:first.start()] + prelude + text[first.start():]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", default=None)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("-k", default=None, help="pytest -k expression (a subset)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    import os

    repo = args.repo or os.environ.get("CAS_ADK_REPO")
    sources: list[tuple[str, str, str]] = []
    for path in FILES:
        try:
            sources.append((path, *read_test(repo, path)))
        except SuiteUnavailable as e:
            print(f"skipped: {e}")
    if not sources:
        print("ADK's tests are unavailable")
        return 2
    with tempfile.TemporaryDirectory(prefix="cas-adk-suite-") as tmp:
        work = Path(tmp)
        names = []
        for path, text, _ in sources:
            dest = work / Path(path).name
            dest.write_text(patch(path, text), encoding="utf-8")
            names.append(dest.name)
        if args.k:
            names += ["-k", args.k]
        lines = run_pytest(work, names, timeout=args.timeout, verbose=args.verbose)
    backends = THEIRS + OURS
    results = by_backend(lines, backends)
    print(f"ADK's service tests ({', '.join(src for _, _, src in sources)}), "
          f"google-adk {installed_version()} installed:")
    print(table(results, backends))
    try:
        import sqlalchemy  # noqa: F401
        print("DATABASE: ADK's DatabaseSessionService (sqlite:///:memory:)")
    except ImportError:
        print("DATABASE: ADK's SqliteSessionService on a temporary file (google-adk[db], "
              "for DatabaseSessionService, is not installed)")
    bad = only_ours_failed(results, OURS, THEIRS)
    for backend, name in bad:
        print(f"FAILED on {backend} only: {name}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
