"""Moving threads between stores: ``export`` to one bundle file, ``import`` from one (verified),
``copy`` from store to store (only what is missing; run it again to resume)."""

from __future__ import annotations

import argparse
from typing import Any

from cas_checkpoint import copy_threads
from cas_checkpoint.cli import langgraph as lg
from cas_checkpoint.cli.common import OK, emit_json, open_store
from cas_checkpoint.cli.progress import bar
from cas_checkpoint.humanize import human_bytes, plural


def _report(r: Any) -> dict[str, Any]:
    return {k: getattr(r, k) for k in ("thread_id", "threads", "checkpoints", "objects",
                                       "objects_written", "bytes", "bytes_written")
            if hasattr(r, k)}


def cmd_export(args: argparse.Namespace) -> int:
    store = open_store(args)
    args.thread = lg.thread_name(store.threads(), args.thread)  # agent-1: LangGraph's id
    with bar(args, "export") as progress:
        r = store.export_thread(args.thread, args.file, progress=progress)
    if args.json:
        emit_json({"file": args.file, **_report(r)})
    else:
        print(f"exported {args.thread!r}: {plural(r.checkpoints, 'checkpoint')}, "
              f"{plural(r.objects, 'object')}, "
              f"{human_bytes(r.bytes)} in {args.file}")
    return OK


def cmd_import(args: argparse.Namespace) -> int:
    store = open_store(args, create=True)
    with bar(args, "import") as progress:
        r = store.import_bundle(args.file, as_thread=args.as_thread,
                                progress=progress)
    if args.json:
        emit_json({"file": args.file, **_report(r)})
    else:
        print(f"imported {r.thread_id!r}: {plural(r.checkpoints, 'checkpoint')}, every object "
              f"re-hashed; wrote {r.objects_written} of {plural(r.objects, 'object')} (the "
              "store had the rest)")
    return OK


def cmd_copy(args: argparse.Namespace) -> int:
    src = open_store(args)
    dst = open_store(args, args.dest, create=True)
    with bar(args, "copy") as progress:
        r = copy_threads(src, dst, args.threads or None, progress=progress)
    if args.json:
        emit_json({"from": src.url, "to": dst.url, **_report(r)})
    else:
        print(f"copied {plural(len(r.threads), 'thread')} ({plural(r.checkpoints, 'checkpoint')}) "
              f"from {src.url} to {dst.url}: wrote {r.objects_written} of "
              f"{plural(r.objects, 'object')} "
              f"({human_bytes(r.bytes_written)}); run again to resume an interrupted copy")
    return OK
