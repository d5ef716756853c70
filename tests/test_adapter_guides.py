"""Every Python block of the framework guides (docs/guides/adk.md, openai-agents.md,
pydantic-ai.md) runs as written, each on its own (they are self-contained), in a scratch
folder; a guide whose framework is not installed is skipped, saying which extra to install."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

GUIDES = Path(__file__).resolve().parent.parent / "docs" / "guides"
PAGES = {"adk.md": ("google.adk", "adk"), "openai-agents.md": ("agents", "openai-agents"),
         "pydantic-ai.md": ("pydantic_ai", "pydantic-ai")}


def blocks(page: str) -> list[str]:
    text = (GUIDES / page).read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def cases() -> list[Any]:
    out = []
    for page, (module, extra) in PAGES.items():
        if not (GUIDES / page).exists():
            continue
        for i, _ in enumerate(blocks(page)):
            out.append(pytest.param(page, i, module, extra, id=f"{page}-{i + 1}"))
    return out


@pytest.mark.parametrize(("page", "index", "module", "extra"), cases())
def test_guide_block_runs(page: str, index: int, module: str, extra: str, tmp_path: Path,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec(module.split(".")[0]) is None or \
            importlib.util.find_spec(module) is None:
        pytest.skip(f"{page} needs the {extra} extra: pip install -e '.[{extra}]'")
    monkeypatch.chdir(tmp_path)
    code = blocks(page)[index]
    namespace: dict[str, Any] = {"__name__": "guide"}
    try:
        exec(compile(code, f"{page} python block {index + 1}", "exec"), namespace)
    except Exception as exc:  # name the block: the page must be fixed, not this test
        raise AssertionError(f"{page} python block {index + 1} fails: {exc!r}\n{code}") from exc
