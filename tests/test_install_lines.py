"""Every ``pip install ...`` line of the README and the docs resolves from this checkout, and
installs what the pages that name it import: one ``pip install --dry-run --report`` of the
union of their extras (every package counted as if none were installed), then each line's
install set followed through the packages' requirements. Skipped, with the reason, when no
package index answers."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# What an extra must bring besides its own list: the packages its pages' examples import.
NEEDS = {
    "langgraph": {"langgraph", "langgraph-checkpoint", "langchain-core"},
    "s3": {"s3fs"},
    "cli": {"rich"},
    "docs": {"mkdocs", "mkdocs-material"},
    "test": {"pytest", "moto", "langgraph", "s3fs", "rich", "ruff", "mypy", "mkdocs",
             "mkdocs-material"},
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
    return {canon(Requirement(r).name) for r in table["optional-dependencies"][extra]}


def index_answers() -> bool:
    """Whether pip can resolve a core dependency at all (else the machine is offline)."""
    probe = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps",
         "--quiet", "blake3"], capture_output=True, text=True, timeout=300)
    return probe.returncode == 0


@pytest.fixture(scope="module")
def resolved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One ``pip install --dry-run`` of the checkout with every extra the pages name (their union
    resolves, so each line does): the packages pip would install, each with its metadata."""
    report = tmp_path_factory.mktemp("pip") / "report.json"
    extras = sorted({e for line in install_lines() for e in extras_of(line)})
    target = f".[{','.join(extras)}]"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", str(report), target],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 and not index_answers():
        errors = [line.strip() for line in proc.stderr.splitlines()
                  if line.strip().startswith("ERROR")]
        pytest.skip("no package index answers (pip cannot resolve blake3, a core dependency), "
                    "so the install lines were not checked: "
                    + (errors[0] if errors else proc.stderr.strip()[-300:]))
    assert proc.returncode == 0, f"pip could not resolve {target}:\n{proc.stderr[-3000:]}"
    return {canon(i["metadata"]["name"]): i["metadata"]
            for i in json.loads(report.read_text())["install"]}


def installs(resolved: dict[str, Any], extras: list[str]) -> set[str]:
    """What ``pip install '.[extras]'`` brings: the project's requirements and, transitively,
    theirs, markers evaluated for the extras each was asked with (names from the union's
    resolution)."""
    todo: list[tuple[str, frozenset[str]]] = [("cas-checkpoint", frozenset(extras))]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, asked = todo.pop()
        if (name, asked) in seen:
            continue
        seen.add((name, asked))
        assert name in resolved, f"{name} is required but pip would not install it"
        for text in resolved[name].get("requires_dist") or ():
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e})
                                         for e in (*asked, "")):
                todo.append((canon(req.name), frozenset(req.extras)))
    return {name for name, _ in seen}


def test_the_pages_have_install_lines() -> None:
    lines = install_lines()
    assert any("[langgraph]" in line for line in lines), lines
    assert any("[s3]" in line for line in lines), lines
    for line in lines:  # the project is not on a package index: every line installs a checkout
        assert "'." in line or '".' in line or " ." in line, (
            f"{line!r} names the package, which no index holds: install it from the checkout "
            "('.[extra]')")


@pytest.mark.parametrize("line", install_lines())
def test_install_line_installs_what_its_pages_import(line: str,
                                                     resolved: dict[str, Any]) -> None:
    got = installs(resolved, extras_of(line))
    for extra in extras_of(line):
        wanted = own_requirements(extra) | NEEDS.get(extra, set())
        missing = wanted - got
        assert not missing, (f"{line!r} does not install {sorted(missing)}: add them to "
                             f"pyproject.toml's {extra!r} extra")
