"""Where conftest runs the store tests: memory and local by default; S3 too where a test is
marked ``s3_matters(reason)``; ``CAS_TEST_BACKENDS`` lists them all instead. (Collected in a
child pytest on a copy of conftest.py: nothing runs, no moto server starts.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

SAMPLE = """
import pytest

pytestmark = pytest.mark.filterwarnings("ignore")


def test_logic(store):
    pass


@pytest.mark.s3_matters("what only S3 shows")
def test_on_s3_too(backend_kind):
    pass


@pytest.mark.parametrize("backend_kind", ["s3"])
def test_listed(backend_kind):
    pass
"""


FACE = """
FACE = "-async"


def test_x(backend_kind):
    pass
"""

NO_REASON = """
import pytest


@pytest.mark.s3_matters
def test_x(backend_kind):
    pass
"""


def collect(tmp_path: Path, backends: str | None = None) -> tuple[list[str], str]:
    """The test ids collected from the three sample modules, and pytest's whole output."""
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    for name, body in (("sample", SAMPLE), ("face", FACE), ("no_reason", NO_REASON)):
        (tmp_path / f"test_{name}.py").write_text(body)
    env = {k: v for k, v in os.environ.items() if k != "CAS_TEST_BACKENDS"}
    if backends is not None:
        env["CAS_TEST_BACKENDS"] = backends
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "--continue-on-collection-errors", "-o", "markers=s3_matters(reason): S3 too"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    ids = [line for line in proc.stdout.splitlines()
           if line.startswith("test_") and "::" in line and line.endswith("]")]
    return ids, proc.stdout + proc.stderr


def test_store_logic_on_memory_and_local_and_s3_where_marked(tmp_path: Path) -> None:
    ids, out = collect(tmp_path)
    assert [i.split("::")[1] for i in ids] == [
        "test_x[memory-async]", "test_x[local-async]", "test_logic[memory]", "test_logic[local]",
        "test_on_s3_too[memory]", "test_on_s3_too[local]", "test_on_s3_too[s3]",
        "test_listed[s3]"], out
    # a mark without its reason stops its module's collection, saying what to write
    assert "test_no_reason.py::test_x: s3_matters needs a reason" in out, out


def test_cas_test_backends_lists_them(tmp_path: Path) -> None:
    ids, out = collect(tmp_path, "memory,local,s3")
    assert [i for i in ids if "test_logic" in i] == [
        "test_sample.py::test_logic[memory]", "test_sample.py::test_logic[local]",
        "test_sample.py::test_logic[s3]"], out
    ids, out = collect(tmp_path, "memory,s4")
    assert ids == [] and "CAS_TEST_BACKENDS names ['s4']" in out, out
