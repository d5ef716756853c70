"""Every Python block of the README and of the docs runs on its own (a fresh namespace, as a
reader pasting it alone) and twice in a row, in a scratch folder; and the set-up commands are
the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fsspec.implementations.memory import MemoryFileSystem

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(lang: str, page: Path = README) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", page.read_text(), flags=re.S | re.M)


def python_blocks() -> list[Any]:
    return [pytest.param(code, id=f"{page.relative_to(ROOT)}#{i + 1}")
            for page in PAGES for i, code in enumerate(blocks("python", page))]


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch, moto_server: dict[str, Any]) -> None:
    """The S3 blocks run against the moto server, named by ``AWS_ENDPOINT_URL`` as the pages
    tell (the bucket ``my-bucket`` is created first)."""
    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server["endpoint"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    s3 = boto3.client("s3", endpoint_url=moto_server["endpoint"], region_name="us-east-1")
    if "my-bucket" not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket="my-bucket")


def test_the_pages_have_python_blocks() -> None:
    assert len(blocks("python")) >= 4
    assert len(python_blocks()) >= 12
    for page in PAGES:  # an indented fence (inside a list) would not be run: keep them flush
        assert not re.search(r"^[ \t]+```python", page.read_text(), flags=re.M), page


@pytest.mark.parametrize("code", python_blocks())
def test_python_block_runs_alone_and_twice(code: str, tmp_path: Path, s3_env: None,
                                           monkeypatch: pytest.MonkeyPatch,
                                           request: pytest.FixtureRequest) -> None:
    monkeypatch.chdir(tmp_path)
    where = request.node.callspec.id
    for run in (1, 2):
        # a second run is a second process: its memory:// is empty, its folders are not
        MemoryFileSystem.store.clear()
        MemoryFileSystem.pseudo_dirs[:] = [""]
        namespace: dict[str, Any] = {"__name__": "__main__"}
        try:
            exec(compile(code, f"{where} (run {run})", "exec"), namespace)
        except Exception as exc:  # name the block: the page must be fixed, not this test
            raise AssertionError(f"{where} fails on run {run}: {exc!r}\n{code}") from exc


def test_the_test_command_is_the_one_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    bash = blocks("bash")
    test_cmd = next(b.strip() for b in bash if "pytest" in b)
    assert test_cmd in ci
    assert any("cas-checkpoint demo" in b for b in bash)
    for tool in ("ruff check cas_checkpoint", "mypy", "mkdocs build --strict"):
        assert tool in ci and tool in README.read_text()


def test_the_install_section_names_every_extra() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    install = README.read_text().split("## Install", 1)[1].split("\n## ", 1)[0]
    missing = set(extras) - set(re.findall(r"`([a-z0-9-]+)`", install))
    assert not missing, f"README's Install section does not name the extras {sorted(missing)}"
