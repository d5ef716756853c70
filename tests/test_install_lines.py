"""Every ``pip install ...`` line of the README and the docs resolves as written from this
checkout, and installs what the pages that name it import (``pip install --dry-run --report``,
every package counted as if none were installed). Skipped, with the reason, when no package
index answers."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# What an extra must bring besides its own list: the packages its pages' examples import.
NEEDS = {
    "langgraph": {"langgraph", "langgraph-checkpoint", "langchain-core"},
    "s3": {"s3fs"},
    "cli": {"rich"},
    "docs": {"mkdocs", "mkdocs-material"},
    "test": {"pytest", "moto", "langgraph", "s3fs", "rich", "ruff", "mypy"},
}


def install_lines() -> list[str]:
    """Each distinct ``pip install`` command of the pages (in code blocks or inline code), up to
    a shell operator."""
    found: list[str] = []
    for page in PAGES:
        for m in re.finditer(r"pip install ([^`\n&|;]+)", page.read_text()):
            line = "pip install " + m.group(1).strip()
            if line not in found:
                found.append(line)
    return found


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extras_of(line: str) -> list[str]:
    return [e.strip() for group in re.findall(r"\[([^\]]*)\]", line) for e in group.split(",")]


def own_requirements(extra: str) -> set[str]:
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {canon(re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0])
            for r in table["optional-dependencies"][extra]}


def dry_run(args: list[str], tmp: Path) -> set[str]:
    report = tmp / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", str(report), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"pip could not resolve {args}:\n{proc.stderr[-3000:]}"
    return {canon(i["metadata"]["name"]) for i in json.loads(report.read_text())["install"]}


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("pip")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps",
         "--quiet", "--report", str(tmp / "r.json"), "blake3"],
        capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.skip("no package index answers (pip could not resolve blake3), so the install "
                    "lines were not checked: " + proc.stderr.strip().splitlines()[-1:][0]
                    if proc.stderr.strip() else "no package index answers")


def test_the_pages_have_install_lines() -> None:
    lines = install_lines()
    assert any("[langgraph]" in line for line in lines), lines
    assert any("[s3]" in line for line in lines), lines
    for line in lines:  # the project is not on a package index: every line installs a checkout
        assert "'." in line or '".' in line or " ." in line, (
            f"{line!r} names the package, which no index holds: install it from the checkout "
            "('.[extra]')")


@pytest.mark.parametrize("line", install_lines())
def test_install_line_resolves(line: str, index: None, tmp_path: Path) -> None:
    words = shlex.split(line)[2:]
    args = [w for w in words if w not in ("-q", "--quiet")]
    got = dry_run(args, tmp_path)
    assert "cas-checkpoint" in got
    for extra in extras_of(line):
        wanted = own_requirements(extra) | NEEDS.get(extra, set())
        missing = wanted - got
        assert not missing, f"{line!r} does not install {sorted(missing)} (pyproject.toml's " \
            f"{extra!r} extra)"
