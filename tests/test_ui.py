"""The history viewer (``cas_checkpoint.ui``) through Starlette's TestClient: its pages, what
they read (a whole browsing session makes no write request of any kind), escaping, paging and
the ``cas-checkpoint ui`` command. The browser test is tests/test_ui_browser.py."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("jinja2")
pytest.importorskip("httpx")

from starlette.testclient import TestClient  # noqa: E402

from cas_checkpoint import CheckpointStore, Key  # noqa: E402
from cas_checkpoint.backends import Backend, ObjectInfo  # noqa: E402
from cas_checkpoint.ui import create_app  # noqa: E402
from cas_checkpoint.ui import view as uiview  # noqa: E402

HOSTILE = ['<script>alert("x")</script>', '<img src=x onerror="alert(1)">',
           '"><svg onload=alert(2)>']
WRITES = {"put_many", "write_ref", "delete_ref", "delete_many"}


class Counting(Backend):
    """A backend that counts the requests made of it, by method, and passes them on."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.url = inner.url
        self.shared_scope = inner.shared_scope
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:  # capability flags and the like: the inner's
        return getattr(self.inner, name)

    def get(self, key: str) -> bytes:
        self.calls["get"] += 1
        return self.inner.get(key)

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        keys = list(keys)
        self.calls["get"] += len(keys)
        return self.inner.get_many(keys)

    def put_many(self, items: dict[str, bytes]) -> None:
        self.calls["put_many"] += 1
        self.inner.put_many(items)

    def read_ref(self, key: str) -> tuple[bytes, str] | None:
        self.calls["read_ref"] += 1
        return self.inner.read_ref(key)

    def read_refs(self, keys: list[str]) -> list[tuple[bytes, str] | None]:
        self.calls["read_ref"] += len(keys)
        return self.inner.read_refs(keys)

    def write_ref(self, key: str, data: bytes, expected: str | None,
                  refresh: Callable[[], None] | None = None) -> str:
        self.calls["write_ref"] += 1
        return self.inner.write_ref(key, data, expected, refresh)

    def delete_ref(self, key: str, expected: str) -> None:
        self.calls["delete_ref"] += 1
        self.inner.delete_ref(key, expected)

    def list(self, prefix: str) -> list[ObjectInfo]:
        self.calls["list"] += 1
        return self.inner.list(prefix)

    def list_many(self, prefixes: Iterable[str]) -> list[ObjectInfo]:
        prefixes = list(prefixes)
        self.calls["list"] += len(prefixes)
        return list(self.inner.list_many(prefixes))

    def delete_many(self, keys: Iterable[str]) -> list[str]:
        self.calls["delete_many"] += 1
        return self.inner.delete_many(keys)


def conversation(n: int, hostile: bool = False) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        if i % 2:
            out.append({"role": "assistant", "content": f"answer {i}",
                        "tool_calls": [{"name": "lookup", "args": {"q": f"q{i}"}}]})
        else:
            out.append({"role": "user", "content": f"question {i}"})
    if hostile:
        out += [{"role": "user", "content": text} for text in HOSTILE]
    return out


def fill(store: CheckpointStore) -> dict[str, Any]:
    """Thread "agent" (12 saves: a label, a tag, a failed and a manual checkpoint, hostile
    messages at the end), "side" forked at its 5th, 3 small threads."""
    ids = []
    for i in range(12):
        info = store.save("agent", {"messages": conversation(i + 1, hostile=i == 11),
                                    "step": i, "notes": "n" * 5000, "big": list(range(300))},
                          label="start" if i == 0 else HOSTILE[0] if i == 6 else None,
                          tags=["tagged"] if i == 3 else (),
                          status="failed" if i == 8 else "completed",
                          kind="manual" if i == 4 else "automatic",
                          reason="the tool timed out" if i == 8 else None)
        ids.append(info.id)
    store.fork("agent", ids[4], "side")
    store.save("side", {"messages": conversation(3), "step": 99}, status="halted",
               reason="budget")
    for t in range(3):
        store.save(f"small-{t}", {"x": t})
    return {"agent": ids}


def client(store: CheckpointStore) -> TestClient:
    return TestClient(create_app(store))


def test_pages_show_threads_history_checkpoint_diff_search(tmp_path: Path) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"), create=True)
    ids = fill(store)["agent"]
    c = client(store)
    page = c.get("/").text
    for name in ("agent", "side", "small-0", "small-2"):
        assert f'href="/thread?id={name}"' in page
    assert "5 in the store" in page
    failed = c.get("/?status=halted").text
    assert "/thread?id=side" in failed and "/thread?id=agent" not in failed
    assert "/thread?id=agent" not in c.get("/?kind=manual").text
    assert "/thread?id=small-1" in c.get("/?name=SMALL-1").text

    hist = c.get("/thread?id=agent").text
    assert hist.count('class="cp"') == 12  # one node per checkpoint
    assert hist.count("<circle") == 12
    assert '<tspan class="status failed">failed</tspan>' in hist
    assert "the tool timed out" in hist and "#tagged" in hist and ">start<" in hist
    assert 'href="/thread?id=side"' in hist  # where "side" forks off
    side = c.get("/thread?id=side").text
    assert side.count('class="cp"') == 6 and 'href="/thread?id=agent"' in side

    cp = c.get(f"/checkpoint?thread=agent&id={ids[-1]}").text
    assert "Messages <small>15" in cp  # 12 + the three hostile ones
    assert "lookup({&#34;q&#34;: &#34;q11&#34;})" in cp or 'lookup({"q": "q11"})' in cp
    assert 'data-src="/node?thread=agent&amp;id=' in cp  # closed parts load on expand
    assert "status failed" not in cp and "completed" in cp

    d = c.get(f"/diff?a={ids[0]}&b={ids[1]}").text
    assert re.search(r"read <span id=\"nodes-read\">\d+</span> tree nodes", d)
    assert "state[&#34;step&#34;]" in d or 'state["step"]' in d

    picked = c.get(f"/thread?id=agent&pick={ids[2]}").text  # diff two nodes of the graph
    assert "diff from here" in picked and f'href="/diff?a={ids[2]}&amp;b={ids[7]}"' in picked
    r = c.post("/verify", data={"mode": "quick", "thread": "side"}, follow_redirects=False)
    one = wait_for(c, r.headers["location"])
    assert "of thread <a" in one and "OK: no problems found" in one
    assert "1 thread" in one and "1 threads" not in one

    found = c.get("/search?q=question+10").text
    assert "1 match " in found and f"id={ids[-1]}" in found
    assert c.get("/thread?id=nope").status_code == 404
    assert c.get("/checkpoint?thread=agent&id=zz").status_code in (400, 404)


def test_everything_from_a_state_is_escaped() -> None:
    store = CheckpointStore.open("memory://ui-escape", create=True)
    bad = HOSTILE[1]
    store.save(bad, {"messages": [{"role": bad, "content": t} for t in HOSTILE],
                     bad: {"k": bad}}, label=bad, tags=[bad], metadata={bad: bad})
    info = store.save(bad, {"messages": [{"role": "user", "content": HOSTILE[0]}], "x": bad},
                      label=HOSTILE[2])
    first = store.history(bad)[-1]
    c = client(store)
    pages = [c.get("/").text, c.get("/thread", params={"id": bad}).text,
             c.get("/checkpoint", params={"thread": bad, "id": first.id}).text,
             c.get("/node", params={"thread": bad, "id": first.id, "path": '["messages"]'}).text,
             c.get("/node", params={"thread": bad, "id": first.id,
                                    "path": json.dumps([bad])}).text,
             c.get("/diff", params={"a": first.id, "b": info.id}).text,
             c.get("/search", params={"q": "onerror"}).text]
    assert all("Cannot show this" not in html for html in pages)
    for html in pages:
        for text in HOSTILE:
            assert text not in html
        assert "<img" not in html and "<svg onload" not in html
        assert "<script>" not in html.replace('<script src="/static/ui.js" defer></script>', "")
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in pages[2]
    assert "&lt;script&gt;" in pages[2]


def test_a_browsing_session_makes_no_write_request() -> None:
    """Every page, every closed part opened, diff, search and a quick and a deep verify: the
    store is asked to read and list only."""
    counting = Counting(CheckpointStore.open("memory://ui-ro", create=True).backend)
    store = CheckpointStore.from_backend(counting)
    ids = fill(store)["agent"]
    counting.calls.clear()
    c = client(store)
    pages = ["/", "/?status=failed", "/?kind=manual&name=a", "/thread?id=agent",
             "/thread?id=side", f"/thread?id=agent&before={ids[5]}&n=3",
             f"/diff?a={ids[2]}&b={ids[9]}", "/search?q=answer", "/search?q=q1&all=1",
             "/verify"]
    for cid in ids:
        pages.append(f"/checkpoint?thread=agent&id={cid}")
    for url in pages:
        assert c.get(url).status_code == 200, url
    html = c.get(f"/checkpoint?thread=agent&id={ids[-1]}").text
    srcs = set(re.findall(r'data-src="([^"]+)"', html))
    assert len(srcs) > 5
    for src in srcs:
        assert c.get(src.replace("&amp;", "&")).status_code == 200, src
    for mode in ("quick", "deep"):
        r = c.post("/verify", data={"mode": mode}, follow_redirects=False)
        job = r.headers["location"]
        wait_for(c, job)
    assert counting.calls["get"] > 0 and counting.calls["read_ref"] > 0
    assert not {k: v for k, v in counting.calls.items() if k in WRITES}, counting.calls
    assert set(counting.calls) <= {"get", "read_ref", "list"}, counting.calls


def wait_for(c: TestClient, job: str) -> str:
    for _ in range(200):
        html = c.get(job).text
        if 'id="verify-result"' in html:
            return html
        time.sleep(0.05)
    raise AssertionError(f"{job} did not finish")


def test_verify_names_a_damaged_pack_and_its_threads(tmp_path: Path) -> None:
    url = str(tmp_path / "d")
    store = CheckpointStore.open(url, create=True)
    fill(store)
    packs = sorted((p for p in Path(url).rglob("*") if p.is_file()
                    and "refs" not in p.parts and p.name != "cas-store"),
                   key=lambda p: p.stat().st_size)
    assert packs
    data = bytearray(packs[-1].read_bytes())
    data[len(data) // 2] ^= 0xFF
    packs[-1].write_bytes(bytes(data))
    c = client(CheckpointStore.open(url))
    assert "quick" in c.get("/verify").text
    # (a flipped byte keeps the pack's size: the quick check, which reads no pack, misses it)
    r = c.post("/verify", data={"mode": "deep"}, follow_redirects=False)
    assert r.status_code == 303
    html = wait_for(c, r.headers["location"])
    assert "problems</b>" in html and "corrupt" in html
    assert 'href="/thread?id=agent"' in html


def test_large_states_open_a_part_at_a_time() -> None:
    """A 10,000-message state: the page reads its root node and the leaves of its last 50
    messages; the list opens 100 items at a time; message 9,999 alone reads a handful of
    nodes."""
    store = CheckpointStore.open("memory://ui-big", create=True)
    info = store.save("t", {"messages": conversation(10_000), "blob": "y" * 50_000})
    c = client(store)
    html = c.get(f"/checkpoint?thread=t&id={info.id}").text
    assert html.count('class="msg ') == uiview.MESSAGES_SHOWN  # the last 50 messages
    assert "#9999" in html and "#9949" not in html and "« earlier messages" in html
    assert "question 9998" in html and "Messages <small>10000" in html
    assert len(html) < 200_000  # the 10,000 items are not all drawn
    assert "its root node read (1 node)" in html

    def node(path: list[Any], **params: Any) -> str:
        r = c.get("/node", params={"thread": "t", "id": info.id, "path": json.dumps(path),
                                   **params})
        assert r.status_code == 200, r.text
        return r.text

    frag = node(["messages"])  # the first 100 items and a "more"
    assert '<span class="key">99</span>' in frag and '<span class="key">100</span>' not in frag
    assert "9900 more" in frag
    last = node(["messages", 9999])
    assert "answer 9999" in last and "lookup" in last
    more = node(["messages"], offset=9900)
    assert '<span class="key">9999</span>' in more and '<span class="key">9899</span>' not in more
    assert "more…" not in more
    assert "48,000 more characters" not in html  # the blob is stored apart: closed
    assert "50,000 characters" in html
    full = node(["blob"], full="1")
    assert "y" * 50_000 in full
    earlier = c.get(f"/checkpoint?thread=t&id={info.id}&before=100").text
    assert "#50" in earlier and "#99" in earlier and "#100<" not in earlier
    assert store.read_part("t", None, ["messages", 9999]).nodes_read <= 6


def test_merges_draw_a_second_lane(tmp_path: Path) -> None:
    store = CheckpointStore.open(str(tmp_path / "m"), create=True)
    root = store.save("t", {"x": 0})
    a = store.save("t", {"x": 1})
    b = store.save("t", {"x": 2}, expected_head=a.id)
    side = store._run(store._core.save("t", {"x": 3}, parents=[root.id]))  # another writer
    merged = store._run(store._core.save("t", {"x": 4}, parents=[b.id, side.id]))
    from cas_checkpoint.ui.graph import layout

    g = layout(store.history("t"))
    cols = {d.info.id: d.col for d in g.dots}
    assert cols[merged.id] == 0 and cols[side.id] == 1 and cols[root.id] == 0
    assert len(g.edges) == 5  # merge->b, merge->side, b->a, a->root, side->root
    html = client(store).get("/thread?id=t").text
    assert html.count('class="cp"') == 5 and re.search(r'class="dot[^"]* merge', html)


def test_history_pages(tmp_path: Path) -> None:
    store = CheckpointStore.open(str(tmp_path / "p"), create=True)
    ids = [store.save("long", {"i": i}).id for i in range(25)]
    c = client(store)
    first = c.get("/thread?id=long&n=10").text
    assert first.count('class="cp"') == 10 and f"before={ids[15]}" in first
    second = c.get(f"/thread?id=long&before={ids[15]}&n=10").text
    assert second.count('class="cp"') == 10 and ids[14][:12] in second
    assert 'class="edge loose"' in second  # the parent of the page's oldest is on the next


def test_threads_table_pages(tmp_path: Path) -> None:
    store = CheckpointStore.open("memory://ui-many", create=True)
    for i in range(120):
        store.save(f"t{i:03}", {"i": i}, status="failed" if i % 40 == 0 else None)
    c = client(store)
    page = c.get("/").text
    assert page.count('class="thread" href=') == 50 and "start=50" in page
    last = c.get("/?start=100").text
    assert last.count('class="thread" href=') == 20 and "next »" not in last
    failed = c.get("/?status=failed").text
    assert failed.count('class="thread" href=') == 3


def test_encrypted_store(tmp_path: Path) -> None:
    key = Key.generate()
    url = str(tmp_path / "e")
    store = CheckpointStore.open(url, create=True, encryption=key)
    ids = fill(store)["agent"]
    c = client(CheckpointStore.open(url, encryption=key))
    assert "/thread?id=agent" in c.get("/").text
    assert "question 10" in c.get(f"/checkpoint?thread=agent&id={ids[-1]}").text
    for mode in ("quick", "deep"):  # on a store object of its own, with the same keys
        r = c.post("/verify", data={"mode": mode}, follow_redirects=False)
        assert "OK: no problems found" in wait_for(c, r.headers["location"])
    sized = c.get("/?sizes=1").text
    assert "<th class=\"n\">stored</th>" in sized and "KB</td>" in sized


def test_s3_store_pages(moto_server: dict[str, Any]) -> None:
    store = CheckpointStore.open(f"s3://{moto_server['bucket']}/ui-s3",
                                 storage_options=moto_server["storage_options"], create=True)
    ids = fill(store)["agent"]
    c = client(CheckpointStore.open(store.url, storage_options=moto_server["storage_options"]))
    assert c.get("/thread?id=agent").text.count('class="cp"') == 12
    assert "answer 11" in c.get(f"/checkpoint?thread=agent&id={ids[-1]}").text


@pytest.mark.parametrize("kind", ["memory", "s3"])
def test_requests_a_page_makes_on_storage(kind: str, request: pytest.FixtureRequest) -> None:
    """What each page asks of the storage, on a fresh server: a thread's history page and a
    checkpoint page a handful of requests whatever the history holds (300 checkpoints here);
    the threads table two ref reads a row; opening a part of a state one ref read."""
    if kind == "s3":
        server = request.getfixturevalue("moto_server")
        store = CheckpointStore.open(f"s3://{server['bucket']}/ui-count", create=True,
                                     storage_options=server["storage_options"])
    else:
        store = CheckpointStore.open("memory://ui-count", create=True)
    for i in range(300):
        store.save("long", {"messages": conversation(3), "i": i, "big": list(range(300))})
    for t in range(4):
        store.save(f"short-{t}", {"t": t})
    counting = Counting(store.backend)
    c = client(CheckpointStore.from_backend(counting))
    head = store.head("long")
    got = {}
    for name, url in (("threads", "/"), ("history", "/thread?id=long&n=50"),
                      ("older", f"/thread?id=long&n=50&before={head}"),
                      ("checkpoint", f"/checkpoint?thread=long&id={head}"),
                      ("open parts", f"/node?thread=long&id={head}&path=%5B%22big%22%5D"),
                      ("diff", f"/diff?a={store.history('long')[1].id}&b={head}")):
        counting.calls.clear()
        assert c.get(url).status_code == 200
        got[name] = dict(counting.calls)
    print(kind, got)
    assert got["threads"] == {"list": 1, "read_ref": 10}, got  # 5 rows: history + count each
    # the thread's own ref (history, count, head: 3), then each other thread's (fork links: 4)
    assert got["history"].get("read_ref", 0) == 7 and got["history"].get("list", 0) <= 1, got
    # each of the head's packs at most once (a merge of level 2 or more writes a live pack
    # beside its history pack: 7 packs here, 4 before live packs)
    from cas_checkpoint.engine.steps import run

    packs = len(run(store._core.ref("long"), store.backend).head.packs)  # noqa: SLF001
    assert got["history"].get("get", 0) <= packs <= 8, (packs, got)
    # its ref read by each read_part: the root, then the last 50 messages (the packs are
    # the store object's already)
    assert got["checkpoint"] == {"read_ref": 2}, got
    assert got["open parts"] == {"read_ref": 1}, got
    assert sum(got["diff"].values()) <= 12, got


def test_foreign_hosts_and_cross_site_posts_are_refused() -> None:
    store = CheckpointStore.open("memory://ui-host", create=True)
    store.save("t", {"x": 1})
    c = client(store)
    assert c.get("/", headers={"host": "evil.example"}).status_code == 400
    r = c.get("/")
    assert "default-src 'none'" in r.headers["content-security-policy"]
    assert c.post("/verify", data={"mode": "quick"},
                  headers={"origin": "http://evil.example"}).status_code == 403


def test_cli_ui_serves_loopback_and_warns_for_other_hosts(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    import uvicorn

    from cas_checkpoint.cli import main
    from cas_checkpoint.cli.ui import loopback

    url = str(tmp_path / "c")
    CheckpointStore.open(url, create=True).save("t", {"x": 1})
    served: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: served.append(
        (self.config.app, [s.getsockname() for s in sockets or []])))
    assert main(["ui", url, "--port", "0"]) == 0
    out, err = capsys.readouterr()
    host, port = served[0][1][0][:2]
    assert host == "127.0.0.1" and out.startswith(f"serving http://127.0.0.1:{port} ")
    assert "warning" not in err
    assert main(["ui", url, "--host", "0.0.0.0", "--port", "0"]) == 0
    out, err = capsys.readouterr()
    assert "warning: --host 0.0.0.0" in err and "no authentication" in err
    assert main(["ui", str(tmp_path / "none")]) == 2  # no store there: nothing created
    assert not (tmp_path / "none").exists()
    assert loopback("127.0.0.1") and loopback("::1") and loopback("localhost")
    assert not loopback("0.0.0.0") and not loopback("192.168.1.5")


@dataclasses.dataclass
class Note:
    role: str
    content: str


def test_registered_types_and_unknown_classes_show_their_fields(tmp_path: Path) -> None:
    url = str(tmp_path / "r")
    store = CheckpointStore.open(url, create=True, types=[Note])
    info = store.save("t", {"messages": [Note("user", "<b>hi</b>"), Note("assistant", "yes")],
                            "pinned": Note("system", "be brief")})
    html = client(store).get(f"/checkpoint?thread=t&id={info.id}").text
    assert "<b>user</b>" in html and "&lt;b&gt;hi&lt;/b&gt;" in html  # the conversation
    assert '<span class="kind">Note</span>' in html and "be brief" in html
    # opened as the command line opens it, without the class: its stored fields, by name
    from cas_checkpoint.cli.common import _types

    blind = CheckpointStore.open(url, types=_types(argparse.Namespace(types=None)))
    html = client(blind).get(f"/checkpoint?thread=t&id={info.id}").text
    assert "be brief" in html and "Note" in html and "<b>assistant</b>" in html


class Tagged:
    """A class of no stored kind: stored through an adapter the store was given."""

    def __init__(self, label: str) -> None:
        self.label = label


def test_an_adapted_class_shows_the_data_its_adapter_gives() -> None:
    from cas_checkpoint import TypeRegistry

    types = TypeRegistry()
    types.register(Tagged, "t.Tagged", to_data=lambda t: {"label": t.label},
                   from_data=lambda d: Tagged(d["label"]))
    assert uiview.fields_of(Tagged("x"), types) == ("Tagged", {"label": "x"})
    assert uiview.fields_of(Tagged("x"), TypeRegistry()) is None  # not registered: no fields
    store = CheckpointStore.open(f"memory://ui-adapted-{time.time_ns()}", types=types)
    info = store.save("t", {"pinned": Tagged("<i>kept</i>")})
    html = client(store).get(f"/checkpoint?thread=t&id={info.id}").text
    assert '<span class="kind">Tagged</span>' in html and "&lt;i&gt;kept&lt;/i&gt;" in html
