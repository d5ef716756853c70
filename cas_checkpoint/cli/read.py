"""Commands that only read: threads, log, show, diff, stats, search, verify. None of them
creates anything: a URL that holds no store is an error."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from cas_checkpoint import CasError, CheckpointInfo, CheckpointStore, SearchResult
from cas_checkpoint.cli import langgraph as lg
from cas_checkpoint.cli.common import (
    OK,
    PROBLEMS,
    CliError,
    emit_json,
    info_dict,
    jsonable,
    open_store,
)
from cas_checkpoint.cli.progress import bar
from cas_checkpoint.cli.render import follow, graph, info_line, parse_path, path_text, render
from cas_checkpoint.cli.wording import for_cli
from cas_checkpoint.humanize import human_bytes, plural


def _console() -> Console:
    return Console(soft_wrap=False, width=None if sys.stdout.isatty() else 200,
                   highlight=False)


def _stats_by_thread(store: CheckpointStore) -> dict[str, Any]:
    return dict(store.stats(by_thread=True).by_thread)


def cmd_threads(args: argparse.Namespace) -> int:
    if args.names:  # streamed: a page of the listing at a time, nothing else read
        if args.bytes or args.json:
            raise CliError("--names prints bare thread ids: drop --bytes and --json")
        for thread in open_store(args).iter_threads():
            print(thread, flush=False)
        sys.stdout.flush()
        return 0
    store, threads = lg.open_store(args)
    rows: list[dict[str, Any]] = []
    damaged = 0
    per_thread = _stats_by_thread(store) if args.bytes else {}
    for thread in threads:  # one damaged ref does not hide the others
        try:
            lgt = lg.read(store, thread)
            hist = lgt.checkpoints[:1] if lgt else store.history(thread, limit=1)
            count = len(lgt.checkpoints) if lgt else store.count(thread)
        except CasError as exc:
            damaged += 1
            print(f"cas-checkpoint: thread {thread!r}: {for_cli(str(exc))}", file=sys.stderr)
            continue
        head = hist[0] if hist else None
        step = lg.lg_meta(head).get("step") if lgt and head else head.step if head else None
        row: dict[str, Any] = {"thread": thread, "checkpoints": count,
                               "head": head.id if head else None, "head_step": step,
                               "last_saved": head.created_at.isoformat() if head else None,
                               "head_bytes": head.size if head else 0}
        if lgt is not None:
            row["pending_writes"] = lgt.write_count
            row["langgraph"] = {"thread_id": lgt.thread_id, "checkpoint_ns": lgt.ns,
                                "checkpoint_id": head.metadata["lg"] if head else None}
        t = per_thread.get(thread)
        if t is not None:
            row["stored_bytes"] = getattr(t, "physical_bytes", None)
            row["messages"] = getattr(t, "messages", None)
        rows.append(row)
    typed = {r["thread"]: _typed(threads, r) for r in rows}
    any_lg = any("langgraph" in r for r in rows)
    if args.json:
        emit_json({"threads": rows, "damaged": damaged})
    else:
        table = Table(box=None, pad_edge=False)
        for col, justify in (("thread", "left"), ("checkpoints", "right"),
                             *((("pending writes", "right"),) if any_lg else ()),
                             ("head", "left"), ("step", "right"), ("last saved (UTC)", "left"),
                             ("head state", "right")):
            table.add_column(col, justify=justify)
        if args.bytes:
            table.add_column("stored", justify="right")
        for r in rows:
            cells = [typed[r["thread"]], str(r["checkpoints"]),
                     *((str(r.get("pending_writes", "")),) if any_lg else ()),
                     (r["head"] or "")[:12], str(r["head_step"]),
                     (r["last_saved"] or "")[:19].replace("T", " "), human_bytes(r["head_bytes"])]
            if args.bytes:
                cells.append(human_bytes(r["stored_bytes"]) if r.get("stored_bytes") is not None
                             else "")
            table.add_row(*cells)
        if rows:
            _console().print(table)
            if any_lg:
                print("(LangGraph threads: checkpoints are LangGraph's, beside their pending "
                      "writes; name one by its thread id, e.g. "
                      f"{next(typed[r['thread']] for r in rows if 'langgraph' in r)})")
        else:
            print("(no threads)")
    return PROBLEMS if damaged else OK


def _typed(threads: list[str], row: dict[str, Any]) -> str:
    """How a thread is named on the command line: a LangGraph thread by its own id when that
    id names it (its root namespace), else its store name."""
    got = row.get("langgraph")
    if got and got["checkpoint_ns"] == "" and got["thread_id"] not in threads:
        return str(got["thread_id"])
    return str(row["thread"])


def _matches(info: CheckpointInfo, args: argparse.Namespace) -> bool:
    if args.label is not None and info.label != args.label:
        return False
    if args.tag is not None and args.tag not in info.tags:
        return False
    for name in ("status", "kind"):
        want = getattr(args, name)
        if want is not None and getattr(info, name, None) != want:
            return False
    return True


def _forks(store: CheckpointStore, thread: str, hist: list[CheckpointInfo]) -> dict[str, list[str]]:
    """Checkpoint id -> the other threads whose history meets this thread's there last."""
    mine = {i.id for i in hist}
    out: dict[str, list[str]] = {}
    for other in store.threads():
        if other == thread:
            continue
        try:
            theirs = store.history(other)
        except CasError:
            continue
        for info in theirs:  # newest first: the first shared checkpoint is where they part
            if info.id in mine:
                out.setdefault(info.id, []).append(other)
                break
    return out


def cmd_log(args: argparse.Namespace) -> int:
    store, threads = lg.open_store(args)
    args.thread = lg.thread_name(threads, args.thread)
    hist = store.history(args.thread)
    lgt = lg.split(args.thread, hist)
    if lgt is not None:
        return _lg_log(store, args, lgt)
    filtered = any(getattr(args, k) is not None for k in ("label", "tag", "status", "kind"))
    if args.graph and filtered:
        raise CliError("--graph draws the whole DAG: use it without --label/--tag/--status/--kind")
    shown = [i for i in hist if _matches(i, args)]
    if args.limit is not None:
        shown = shown[:args.limit]
    head = hist[0].id if hist else None
    forks = _forks(store, args.thread, hist) if args.graph else {}
    if args.json:
        out = []
        for info in shown:
            d = info_dict(info)
            d["head"] = info.id == head
            if args.graph:
                d["forks"] = forks.get(info.id, [])
            out.append(d)
        emit_json({"thread": args.thread, "checkpoints": len(hist), "log": out})
        return OK
    print(f"thread {args.thread!r}: {plural(len(hist), 'checkpoint')}"
          + (f", {len(shown)} shown" if len(shown) != len(hist) else ""))
    if not args.graph:
        for info in shown:
            print(("* " if info.id == head else "  ") + info_line(info))
        return OK
    ids = {i.id for i in shown}
    for prefix, row in graph(hist if args.limit is None else shown):
        if row is None:
            print(prefix)
        elif row.id in ids:
            others = forks.get(row.id)
            extra = ("<- also in " + ", ".join(repr(t) for t in others)) if others else ""
            print(f"{prefix}  {info_line(row, head=row.id == head, extra=extra)}")
    return OK


def _lg_log(store: CheckpointStore, args: argparse.Namespace, lgt: lg.LgThread) -> int:
    """A LangGraph thread's log: its checkpoints newest first (LangGraph's order), each with
    LangGraph's step, source, next nodes and pending writes; the writes are counted, not
    listed as checkpoints."""
    cps = lgt.checkpoints
    shown = [i for i in cps if _matches(i, args)]
    if args.limit is not None:
        shown = shown[:args.limit]
    head = cps[0].id if cps else None
    details = {i.id: _lg_details(store, lgt, i) for i in shown}
    if args.json:
        out = []
        for info in shown:
            d = info_dict(info)
            d["head"] = info.id == head
            d["langgraph"] = lg.fields(info, **details[info.id])
            out.append(d)
        emit_json({"thread": args.thread, "langgraph_thread": lgt.thread_id,
                   "checkpoint_ns": lgt.ns, "checkpoints": len(cps),
                   "pending_writes": lgt.write_count, "log": out})
        return OK
    print(f"thread {args.thread!r}: " + lg.header(lgt)
          + (f", {len(shown)} shown" if len(shown) != len(cps) else ""))
    if not args.graph:
        for info in shown:
            print(("* " if info.id == head else "  ") + lg.line(info, **details[info.id]))
        return OK
    ids = {i.id for i in shown}
    in_log = [i for i in store.history(args.thread) if lg.is_checkpoint(i)]  # log order
    for prefix, row in graph(in_log):
        if row is None:
            print(prefix)
        elif row.id in ids:
            print(f"{prefix}  {lg.line(row, **details[row.id])}"
                  + ("  (latest)" if row.id == head else ""))
    return OK


def _lg_details(store: CheckpointStore, lgt: lg.LgThread, info: CheckpointInfo
                ) -> dict[str, Any]:
    """Next nodes (from the checkpoint's state), its pending writes and their special kinds
    (from the writes' states)."""
    writes = lgt.writes.get(str(info.metadata["lg"]), [])
    nodes = lg.next_nodes(store.load(lgt.name, info.id).state)
    kinds = lg.write_kinds(store.load(lgt.name, w.id).state for w in writes)
    return {"nodes": nodes, "writes": len(writes), "kinds": kinds}


def cmd_show(args: argparse.Namespace) -> int:
    store, threads = lg.open_store(args)
    if args.checkpoint is not None:
        info = lg.resolve(store, args.checkpoint, thread=args.target, threads=threads)
    elif args.target is not None:
        info = lg.resolve(store, args.target, threads=threads)
    else:
        named = {(got[0] if (got := lg.parse_name(t)) and any(
            lg.parse_name(u) == (got[0], "") for u in threads) else t) for t in threads}
        if len(named) != 1:
            raise CliError(f"the store has {plural(len(threads), 'thread')}: name one (or a "
                           "checkpoint id)")
        info = lg.resolve(store, named.pop(), threads=threads)
    cp = store.load(info.thread_id, info.id)
    state = cp.state
    where = "state"
    if args.path:
        steps = parse_path(args.path)
        state = follow(state, steps, store.types)
        where = "state" + path_text(steps)
    lgt = lg.read(store, info.thread_id) if lg.is_checkpoint(info) else None
    details = _lg_details(store, lgt, info) if lgt is not None else None
    if args.json:
        extra = {"langgraph": lg.fields(info, **details)} if details is not None else {}
        emit_json({"checkpoint": info_dict(info), **extra, "path": where,
                   "value": jsonable(state)})
        return OK
    if not args.state_only:
        if lgt is not None and details is not None:
            print(f"LangGraph thread {lgt.label}  checkpoint_id {info.metadata['lg']}"
                  + (f"  parent {info.metadata['lgp']}" if info.metadata.get("lgp") else ""))
            print(lg.line(info, **details))
        else:
            print(info_line(info))
        print(f"thread {info.thread_id!r}  id {info.id}")
        if info.parent_ids:
            print("parents " + " ".join(p for p in info.parent_ids))
        print(f"{where} =")
    print(render(state, full=args.full))
    return OK


def _value(v: Any) -> str:
    text = render(v)
    return text if "\n" not in text else " ".join(line.strip() for line in text.splitlines())


def cmd_diff(args: argparse.Namespace) -> int:
    store, threads = lg.open_store(args)
    a = lg.resolve(store, args.a, thread=args.thread, threads=threads)
    b = lg.resolve(store, args.b, thread=args.thread, threads=threads)
    d: Any = store.diff(a.id, b.id)
    if args.json:
        emit_json({"a": info_dict(a), "b": info_dict(b), "nodes_read": d.nodes_read,
                   "changes": [{"path": c.path, "op": c.op, "old": jsonable(c.old),
                                "new": jsonable(c.new)} for c in d.changes]})
        return OK
    print(f"--- {a.thread_id} {a.id[:12]} ({_step(a)})")
    print(f"+++ {b.thread_id} {b.id[:12]} ({_step(b)})")
    for c in d.changes:
        path = "state" + c.path
        if c.op == "added":
            print(f"+ {path} = {_cut(_value(c.new))}")
        elif c.op == "removed":
            print(f"- {path} = {_cut(_value(c.old))}")
        else:
            print(f"~ {path}: {_cut(_value(c.old))} -> {_cut(_value(c.new))}")
    print(f"{plural(len(d.changes), 'change')}; read {plural(d.nodes_read, 'tree node')}")
    return OK


def _step(info: CheckpointInfo) -> str:
    if lg.is_checkpoint(info):
        return f"LangGraph step {lg.lg_meta(info).get('step')}, {info.metadata['lg']}"
    return f"step {info.step}"


def _cut(text: str, n: int = 160) -> str:
    return text if len(text) <= n else \
        text[:n] + f" ... ({plural(len(text) - n, 'more character', fmt=',')})"


def cmd_stats(args: argparse.Namespace) -> int:
    store, threads = lg.open_store(args) if args.by_thread else (open_store(args), [])
    stats: Any = store.stats(by_thread=True) if args.by_thread else store.stats()
    fields = ("threads", "checkpoints", "logical_bytes", "physical_bytes", "objects",
              "dedup_ratio")
    total = {f: getattr(stats, f) for f in fields}
    per = {t: jsonable(vars(s) if hasattr(s, "__dict__") else
                       {k: getattr(s, k) for k in getattr(s, "__slots__", ())})
           for t, s in (getattr(stats, "by_thread", None) or {}).items()}
    for thread, row in per.items():
        _lg_stats(store, thread, row)
    writes = _pending_writes(store)
    if writes is not None:  # LangGraph threads: their pending writes are entries too
        total["checkpoints"], total["pending_writes"] = stats.checkpoints - writes, writes
    counted = (plural(stats.checkpoints, "checkpoint") if writes is None else
               f"{plural(stats.checkpoints - writes, 'checkpoint')} and "
               f"{plural(writes, 'pending write')}")
    if args.json:
        emit_json({**total, **({"by_thread": per} if args.by_thread else {})})
        return OK
    print(f"{plural(stats.threads, 'thread')}, {counted}: states add up to "
          f"{human_bytes(stats.logical_bytes)}, stored in {human_bytes(stats.physical_bytes)} "
          f"({plural(stats.objects, 'pack')}): {stats.dedup_ratio:.1f}x less than a copy per "
          "checkpoint")
    if args.by_thread and per:
        table = Table(box=None, pad_edge=False)
        any_lg = any("pending_writes" in s for s in per.values())
        for col in ("thread", "checkpoints", *(("pending writes",) if any_lg else ()),
                    "messages", "logical", "stored", "dedup"):
            table.add_column(col, justify="left" if col == "thread" else "right")
        for thread, s in per.items():
            table.add_row(thread, str(s.get("checkpoints", "")),
                          *((str(s.get("pending_writes", "")),) if any_lg else ()),
                          "" if s.get("messages") is None else str(s["messages"]),
                          human_bytes(s.get("logical_bytes") or 0),
                          human_bytes(s.get("physical_bytes") or 0),
                          f"{s.get('dedup_ratio') or 0:.1f}x")
        _console().print(table)
    return OK


def _pending_writes(store: CheckpointStore) -> int | None:
    """How many of the store's entries are LangGraph's pending writes (None: no LangGraph
    thread); an entry forked threads share counts once, as in ``stats``."""
    names = [t for t in store.threads() if lg.parse_name(t)]
    if not names:
        return None
    ids: set[str] = set()
    for name in names:
        try:
            lgt = lg.read(store, name)
        except CasError as exc:
            print(f"cas-checkpoint: thread {name!r}: {for_cli(str(exc))}", file=sys.stderr)
            continue
        if lgt is not None:
            ids.update(w.id for ws in lgt.writes.values() for w in ws)
    return len(ids)


def _lg_stats(store: CheckpointStore, thread: str, row: dict[str, Any]) -> None:
    """A LangGraph thread's row: its checkpoints apart from its pending writes, and the
    messages of its latest checkpoint (``channel_values["messages"]``)."""
    try:
        lgt = lg.read(store, thread)
        if lgt is None:
            return
        row["checkpoints"] = len(lgt.checkpoints)
        row["pending_writes"] = lgt.write_count
        if lgt.checkpoints:
            row["messages"] = lg.message_count(store.load(thread, lgt.checkpoints[0].id).state)
    except CasError as exc:  # the figures stay the store's; say why they are not LangGraph's
        print(f"cas-checkpoint: thread {thread!r}: {for_cli(str(exc))}", file=sys.stderr)


def cmd_search(args: argparse.Namespace) -> int:
    store, threads = lg.open_store(args)
    if args.thread is not None:
        args.thread = lg.thread_name(threads, args.thread)
    with bar(args, "search", "checkpoints") as progress:
        r: Any = _search(store, threads, args, progress)
    if args.json:
        emit_json({"query": args.query, "regex": args.regex, "matches": [
            {"thread": m.thread_id, "checkpoint": m.checkpoint_id, "path": m.path,
             "snippet": m.snippet} for m in r.matches],
            "checkpoints_searched": r.checkpoints_searched, "nodes_read": r.nodes_read,
            "bytes_read": r.bytes_read})
        return OK
    print(f"{plural(len(r.matches), 'match', 'matches')} in "  # the count first, then each
          f"{plural(r.checkpoints_searched, 'checkpoint')}; read "
          f"{plural(r.nodes_read, 'tree node')} "
          f"({human_bytes(r.bytes_read)})" + (":" if r.matches else ""))
    for m in r.matches:
        print(f"{m.thread_id}  {m.checkpoint_id[:12]}  state{m.path}  {m.snippet}")
    return OK


def _search(store: CheckpointStore, threads: list[str], args: argparse.Namespace,
            progress: Any) -> Any:
    """``store.search``; without ``--all-history``, a LangGraph thread is searched at its latest
    checkpoint (its head may be a pending write), so each thread is searched on its own."""
    kw: dict[str, Any] = {"regex": args.regex, "progress": progress}
    targets = [args.thread] if args.thread is not None else threads
    if args.all_history or not any(lg.parse_name(t) for t in targets):
        return store.search(args.query, thread_id=args.thread, all_history=args.all_history,
                            limit=args.limit, **kw)
    matches: list[Any] = []
    searched = nodes = read = 0
    truncated = False
    for thread in targets:
        lgt = lg.read(store, thread)
        if lgt is not None and not lgt.checkpoints:
            continue
        left = None if args.limit is None else args.limit - len(matches)
        if left == 0:
            break
        r = store.search(args.query, thread_id=thread, limit=left,
                         checkpoint_id=lgt.checkpoints[0].id if lgt is not None else None, **kw)
        matches += r.matches
        truncated = truncated or r.truncated
        searched, nodes, read = (searched + r.checkpoints_searched, nodes + r.nodes_read,
                                 read + r.bytes_read)
    return SearchResult(matches, nodes, read, searched, truncated)


def cmd_verify(args: argparse.Namespace) -> int:
    store = open_store(args)
    if args.thread is not None:
        args.thread = lg.thread_name(store.threads(), args.thread)
    with bar(args, "verify") as progress:
        report = store.verify(deep=args.deep or args.sample is not None, sample=args.sample,
                              thread_id=args.thread, progress=progress)
    if args.json:
        print(report.to_json())
        return OK if report.ok else PROBLEMS
    text = report.to_text(limit=None if args.verbose else SHOW)
    print(for_cli(text))
    if text != report.to_text():
        print("(-v lists them all; --json too)")
    return OK if report.ok else PROBLEMS


SHOW = 10  # notes, problems and ids a problem names that verify prints before it counts
