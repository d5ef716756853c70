"""The viewer's pages (Starlette): threads, a thread's history, a checkpoint, a diff, search
and verify. Read-only: every handler calls reading methods of the public ``CheckpointStore``
API alone (``threads``, ``history``, ``count``, ``load``, ``diff``, ``search``, ``verify``),
so the server makes no write request of any kind. Everything a store holds reaches the page
through Jinja2's autoescaping; the page loads nothing from anywhere but this server (its
Content-Security-Policy says so to the browser)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from importlib import resources
from typing import Any, TypeVar

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from cas_checkpoint import (
    CasError,
    CheckpointId,
    CheckpointStore,
    InvalidArgumentError,
    NotFoundError,
    StatePart,
    VerifyReport,
)
from cas_checkpoint.humanize import human_bytes
from cas_checkpoint.ui import view
from cas_checkpoint.ui.graph import layout

T = TypeVar("T")

PAGE_THREADS = 50  # rows of the threads table
SCAN_THREADS = 2000  # heads read at most for one page of a filtered table
PAGE_CHECKPOINTS = 200  # checkpoints of a history page
FORK_SCAN = 100  # forks are looked for when the store has at most this many threads
THREADS_TTL = 5.0  # seconds the list of threads is reused
CHANGES_SHOWN = 2000
SEARCH_LIMIT = 100
JOBS_KEPT = 20  # verify runs remembered
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    # same-origin: the browser names this server as the Origin of its own forms' posts (with
    # no-referrer it sends "null", which verify_start refuses like any other site's)
    "Referrer-Policy": "same-origin",
}


@dataclass
class VerifyJob:
    deep: bool
    thread: str | None = None
    done: int = 0
    total: int = 0
    report: VerifyReport | None = None
    error: str | None = None
    started: float = field(default_factory=time.time)


class Viewer:
    """The store and what the pages remember: the list of threads for a few seconds, verify
    runs. Calls to the store take turns (one lock): a store object is not shared between
    threads."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self.lock = threading.Lock()
        self._threads: tuple[float, list[str]] | None = None
        self.jobs: dict[str, VerifyJob] = {}

    def call(self, fn: Callable[[], T]) -> T:
        with self.lock:
            return fn()

    def threads(self) -> list[str]:
        now = time.monotonic()
        if self._threads is None or now - self._threads[0] > THREADS_TTL:
            self._threads = (now, self.call(self.store.threads))
        return self._threads[1]


def _env() -> Environment:
    env = Environment(loader=PackageLoader("cas_checkpoint.ui", "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["bytes"] = human_bytes
    env.filters["when"] = lambda d: d.strftime("%Y-%m-%d %H:%M:%S")
    env.filters["short"] = view.short
    env.filters["sid"] = lambda s: str(s)[:12]
    return env


def _arg(request: Request, name: str, default: str = "") -> str:
    return request.query_params.get(name, default).strip()


def _int(request: Request, name: str, default: int = 0) -> int:
    try:
        return max(0, int(_arg(request, name, str(default))))
    except ValueError:
        return default


def create_app(store: CheckpointStore, *, allowed_hosts: Iterable[str] = ()) -> Starlette:
    """The viewer of ``store`` as an ASGI app (serve it with uvicorn, or test it with
    Starlette's TestClient). ``allowed_hosts``: Host headers it answers besides 127.0.0.1 and
    localhost (a page of another site that resolves its name to this machine is refused)."""
    viewer = Viewer(store)
    env = _env()
    for name in env.list_templates():  # compiled at start, not on the first page of each kind
        env.get_template(name)

    def page(template: str, code: int = 200, /, **context: Any) -> HTMLResponse:
        html = env.get_template(template).render(url=store.url, **context)
        return HTMLResponse(html, status_code=code, headers=SECURITY_HEADERS)

    def guarded(fn: Callable[[Request], Response]) -> Callable[[Request], Response]:
        def run(request: Request) -> Response:
            try:
                return fn(request)
            except NotFoundError as exc:
                return page("error.html", 404, error=str(exc))
            except (CasError, ValueError, KeyError) as exc:
                return page("error.html", 400, error=f"{type(exc).__name__}: {exc}")
        return run

    @guarded
    def threads_page(request: Request) -> Response:
        name, status, kind = _arg(request, "name"), _arg(request, "status"), _arg(request, "kind")
        start = _int(request, "start")
        sizes = _arg(request, "sizes") == "1"
        names = viewer.threads()
        stored = viewer.call(partial(store.stats, by_thread=True)).by_thread if sizes else {}
        chosen = [t for t in names if name.lower() in t.lower()] if name else names
        rows: list[dict[str, Any]] = []
        pos = start
        scanned = 0
        while pos < len(chosen) and len(rows) < PAGE_THREADS and scanned < SCAN_THREADS:
            thread = chosen[pos]
            pos += 1
            scanned += 1
            try:
                hist = viewer.call(partial(store.history, thread, limit=1))
                count = viewer.call(partial(store.count, thread))
            except CasError as exc:
                if not status and not kind:
                    rows.append({"thread": thread, "error": str(exc)})
                continue
            head = hist[0] if hist else None
            if status and (head is None or head.status != status):
                continue
            if kind and (head is None or head.kind != kind):
                continue
            row = stored.get(thread)
            rows.append({"thread": thread, "count": count, "head": head,
                         "stored": None if row is None else row.physical_bytes})
        return page("threads.html", rows=rows, name=name, status=status, kind=kind, sizes=sizes,
                    total=len(names), matching=len(chosen), start=start, next=pos
                    if pos < len(chosen) else None, scanned=scanned,
                    prev=max(0, start - PAGE_THREADS) if start else None)

    def _forks(thread: str, ids: set[str]) -> tuple[dict[str, list[str]], bool]:
        names = viewer.threads()
        if len(names) > FORK_SCAN:
            return {}, False
        out: dict[str, list[str]] = {}
        for other in names:
            if other == thread:
                continue
            try:
                theirs = viewer.call(partial(store.history, other))
            except CasError:
                continue
            for info in theirs:  # newest first: the first shared checkpoint is where they part
                if info.id in ids:
                    out.setdefault(info.id, []).append(other)
                    break
        return out, True

    @guarded
    def thread_page(request: Request) -> Response:
        thread = _arg(request, "id")
        before = _arg(request, "before") or None
        n = min(_int(request, "n", PAGE_CHECKPOINTS) or PAGE_CHECKPOINTS, 2000)
        got = viewer.call(partial(store.history, thread, limit=n + 1,
                                  before=CheckpointId(before) if before else None))
        count = viewer.call(partial(store.count, thread))
        infos, more = got[:n], len(got) > n
        head = viewer.call(partial(store.head, thread))
        forks, looked = _forks(thread, {i.id for i in infos})
        return page("thread.html", thread=thread, infos=infos, more=more, count=count,
                    head=head, g=layout(infos), forks=forks, looked=looked, before=before,
                    n=n, fork_scan=FORK_SCAN, pick=_arg(request, "pick"))

    def part(thread: str, cid: str, path: list[Any], start: int = 0,
             count: int = view.PAGE_ITEMS) -> StatePart:
        return viewer.call(partial(store.read_part, thread, CheckpointId(cid) if cid else None,
                                   path, start=start, count=count))

    @guarded
    def checkpoint_page(request: Request) -> Response:
        thread, cid = _arg(request, "thread"), _arg(request, "id")
        root = part(thread, cid, [])  # the root node alone
        info = root.checkpoint
        convo = None
        where = view.messages_path(root.value)
        if where is not None:
            total = view.known_length(root.value, where)
            try:  # (not known from the root: ask for it, reading no item)
                total = total if total is not None else part(thread, info.id, where,
                                                             count=0).length or 0
            except (NotFoundError, InvalidArgumentError):  # channel_values had no messages
                total, where = 0, None
            if where is not None:
                before = _arg(request, "before")
                end = min(int(before), total) if before.isdigit() else total
                first = max(0, end - view.MESSAGES_SHOWN)
                got = part(thread, info.id, where, first, end - first)
                convo = (total, view.conversation(got.value, first, where, types=store.types))
        tree = view.tree(root.value, types=store.types)
        return page("checkpoint.html", thread=thread, info=info, root=tree, convo=convo,
                    nodes_read=root.nodes_read, shown=view.MESSAGES_SHOWN)

    @guarded
    def node_fragment(request: Request) -> Response:
        thread, cid = _arg(request, "thread"), _arg(request, "id")
        path, sub = view.decode(_arg(request, "path")), view.decode(_arg(request, "sub"))
        offset, full = _int(request, "offset"), _arg(request, "full") == "1"
        if sub:  # inside a stored object (read whole with its node): followed in memory
            value = view.follow(part(thread, cid, path).value, sub, store.types)
            first, length = offset, None
            if isinstance(value, (list, tuple)):
                length = len(value)
                value = value[offset:offset + view.PAGE_ITEMS]
        else:
            got = part(thread, cid, path, offset)
            value, first, length = got.value, got.start, got.length
        node = view.tree(value, path, sub, types=store.types, first=first, length=length,
                         full_text=full)
        html = env.get_template("node.html").render(node=node, thread=thread, cid=cid,
                                                     fragment=True)
        return HTMLResponse(html, headers=SECURITY_HEADERS)

    @guarded
    def diff_page(request: Request) -> Response:
        a, b = _arg(request, "a"), _arg(request, "b")
        if not a or not b:
            return page("error.html", 400, error="a diff needs two checkpoint ids: a=ID&b=ID "
                        "(pick two in a thread's history)")
        d = viewer.call(partial(store.diff, CheckpointId(a), CheckpointId(b)))
        return page("diff.html", d=d, changes=d.changes[:CHANGES_SHOWN],
                    cut=max(0, len(d.changes) - CHANGES_SHOWN))

    @guarded
    def search_page(request: Request) -> Response:
        q = request.query_params.get("q", "")
        regex, everywhere = _arg(request, "regex") == "1", _arg(request, "all") == "1"
        thread = _arg(request, "thread") or None
        result = None
        if q:
            result = viewer.call(partial(store.search, q, regex=regex, thread_id=thread,
                                         all_history=everywhere, limit=SEARCH_LIMIT))
        return page("search.html", q=q, regex=regex, everywhere=everywhere, thread=thread,
                    result=result)

    def verify_page(request: Request) -> Response:
        return page("verify.html", job=None, job_id=None, jobs=viewer.jobs)

    async def verify_start(request: Request) -> Response:
        origin = request.headers.get("origin")
        if origin is not None and origin.split("://", 1)[-1] != request.headers.get("host"):
            # another site's page (or a sandboxed one: "null") posting to this server
            return page("error.html", 403, error="a verify is started from this server's own "
                        "page only")
        form = await request.form()
        deep = form.get("mode") == "deep"
        thread = str(form.get("thread") or "") or None
        job_id = uuid.uuid4().hex[:12]
        job = viewer.jobs[job_id] = VerifyJob(deep=deep, thread=thread)
        while len(viewer.jobs) > JOBS_KEPT:  # the oldest runs' reports go
            viewer.jobs.pop(next(iter(viewer.jobs)))

        def progress(done: int, total: int) -> None:
            job.done, job.total = done, total

        def work() -> None:
            # its own store object (caches and all): browsing goes on while it runs
            other = CheckpointStore.from_backend(store.backend, types=store.types)
            try:
                job.report = other.verify(deep=deep, thread_id=thread, progress=progress)
            except CasError as exc:
                job.error = str(exc)
            except Exception as exc:  # noqa: BLE001 - shown on the page, not lost in a thread
                job.error = f"{type(exc).__name__}: {exc}"

        threading.Thread(target=work, name=f"verify-{job_id}", daemon=True).start()
        return RedirectResponse(f"/verify/{job_id}", status_code=303)

    def verify_job(request: Request) -> Response:
        job_id = request.path_params["job"]
        job = viewer.jobs.get(job_id)
        if job is None:
            return page("error.html", 404, error=f"no verify run {job_id!r}; start one from "
                        "the verify page")
        return page("verify.html", job=job, job_id=job_id, jobs=viewer.jobs)

    static = StaticFiles(directory=str(resources.files("cas_checkpoint.ui") / "static"))
    hosts = ["127.0.0.1", "localhost", "[::1]", "testserver", *allowed_hosts]
    return Starlette(routes=[
        Route("/", threads_page),
        Route("/thread", thread_page),
        Route("/checkpoint", checkpoint_page),
        Route("/node", node_fragment),
        Route("/diff", diff_page),
        Route("/search", search_page),
        Route("/verify", verify_page, methods=["GET"]),
        Route("/verify", verify_start, methods=["POST"]),
        Route("/verify/{job}", verify_job),
        Route("/favicon.ico", lambda request: Response(status_code=204)),
        Mount("/static", static, name="static"),
    ], middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=hosts)])
