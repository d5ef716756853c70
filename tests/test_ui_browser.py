"""The viewer in a real browser: Debian's Chromium, headless, driven by Playwright for Python
(``executable_path``; Playwright's own browser download is not used), against
``cas-checkpoint ui`` run as a subprocess on 127.0.0.1. Skips, saying why, when Playwright or a
Chromium binary is missing (``apt-get install chromium``; CAS_CHROMIUM names another binary).
With CAS_UI_SCREENSHOTS=DIR it saves a screenshot of each page there (the docs' pictures)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright for Python is not "
                               "installed (pip install playwright)")

from test_ui import HOSTILE, conversation, fill  # noqa: E402

from cas_checkpoint import CheckpointStore  # noqa: E402

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
ROOT = Path(__file__).resolve().parent.parent
SHOTS = os.environ.get("CAS_UI_SCREENSHOTS")


def chromium() -> str | None:
    for name in (os.environ.get("CAS_CHROMIUM"), "chromium", "chromium-browser"):
        if name and (path := shutil.which(name)):
            return path
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    exe = chromium()
    if exe is None:
        pytest.skip("no Chromium binary found (apt-get install chromium, or set CAS_CHROMIUM)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    procs: list[subprocess.Popen[str]] = []

    def start(url: str) -> str:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen([sys.executable, "-m", "cas_checkpoint.cli", "ui", url,
                                 "--port", "0"], stdout=subprocess.PIPE, text=True, env=env)
        procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.match(r"serving (http://127\.0\.0\.1:\d+) \(read-only\)", line)
        assert m, line
        return m.group(1)

    yield start
    for proc in procs:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def shot(page: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=False)


def test_browse_a_store(browser: Any, serve: Any, tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    store = CheckpointStore.open(url, create=True)
    fill(store)
    big = store.save("long-chat", {"messages": conversation(10_000)})
    base = serve(url)
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    outside: list[str] = []
    page.on("request", lambda r: None if r.url.startswith(base) else outside.append(r.url))

    page.goto(base + "/")
    assert page.locator("a.thread").count() == 6
    shot(page, "threads")
    page.click("text=agent")
    page.wait_for_url(re.compile(r".*/thread\?id=agent$"))
    assert page.locator("svg#history a.cp").count() == 12  # one node per checkpoint
    assert page.locator("svg#history circle.failed").count() == 1
    assert page.locator("svg#history a.fork").count() == 1
    shot(page, "history")

    page.locator("svg#history a.pick").nth(11).click()  # the first checkpoint...
    page.wait_for_url(re.compile(r".*pick="))
    page.locator("svg#history a.pick").first.click()  # ...against the head
    page.wait_for_url(re.compile(r".*/diff\?"))
    assert int(page.locator("#nodes-read").inner_text()) > 0
    assert page.locator("table.diff tbody tr").count() > 3
    shot(page, "diff")

    page.goto(base + "/thread?id=agent")
    page.locator("svg#history a.cp").first.click()  # the head: hostile messages at the end
    page.wait_for_url(re.compile(r".*/checkpoint\?"))
    texts = page.locator(".conversation .msg .text").all_inner_texts()
    for hostile in HOSTILE:
        assert any(hostile in t for t in texts), texts  # shown as text...
    assert page.locator("main img").count() == 0  # ...never as markup
    assert page.locator("main script").count() == 0
    assert page.locator("main svg[onload]").count() == 0
    shot(page, "checkpoint")
    closed = page.locator("section.state details[data-src]", has=page.locator(
        "summary .key", has_text=re.compile(r"^big$"))).first  # 300 items
    closed.locator("summary").click()
    closed.locator(".kids .leaf").first.wait_for()
    assert closed.locator(".kids > .leaf").count() == 100
    closed.locator("button.more").click()
    page.locator("section.state .loaded > .leaf").nth(99).wait_for()  # the next 100

    page.goto(f"{base}/checkpoint?thread=long-chat&id={big.id}")
    assert page.locator(".conversation .msg").count() == 50
    last = page.locator("#msg-9999 details.raw")
    last.locator("summary").click()
    last.locator(".kids .leaf").first.wait_for()
    assert "answer 9999" in last.inner_text() and "lookup" in last.inner_text()
    shot(page, "conversation")

    page.goto(base + "/search?q=question+10")
    assert page.locator("table.matches tbody tr").count() >= 1
    shot(page, "search")
    assert dialogs == [], dialogs  # no script from a state ever ran
    assert outside == [], outside  # nothing requested from anywhere else


def test_verify_a_damaged_store(browser: Any, serve: Any, tmp_path: Path) -> None:
    url = str(tmp_path / "d")
    fill(CheckpointStore.open(url, create=True))
    packs = sorted((p for p in Path(url).rglob("*") if p.is_file() and "refs" not in p.parts
                    and p.name != "cas-store"), key=lambda p: p.stat().st_size)
    data = bytearray(packs[-1].read_bytes())
    data[len(data) // 2] ^= 0xFF
    packs[-1].write_bytes(bytes(data))
    base = serve(url)
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(base + "/verify")
    page.check("input[value=deep]")
    page.click("#verify-start")
    page.locator("#verify-result").wait_for(timeout=30_000)
    assert "problems" in page.locator("#verify-result").inner_text()
    assert page.locator("table.problems td.failed").count() >= 1
    assert page.locator("table.problems a", has_text="agent").count() >= 1
    shot(page, "verify")
