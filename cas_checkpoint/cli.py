"""The ``cas-checkpoint`` command. It uses only the public API."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from . import CasError, CheckpointStore
from ._fmt import human_bytes as _human
from .store import CheckpointInfo


def _print_history(store: CheckpointStore, thread: str, limit: int | None = None) -> None:
    head = store.head(thread)
    print(f"thread {thread!r}: {store.count(thread)} checkpoints")
    for info in store.history(thread, limit=limit):
        print("  " + _line(info, info.id == head))


def _line(info: CheckpointInfo, is_head: bool) -> str:
    parts = [info.id[:12], f"step {info.step:>3}", info.created_at.strftime("%H:%M:%S"),
             _human(info.size).rjust(8)]
    if info.label:
        parts.append(f"label={info.label}")
    if info.tags:
        parts.append("tags=" + ",".join(info.tags))
    if info.metadata:
        parts.append(" ".join(f"{k}={v}" for k, v in info.metadata.items()))
    return ("* " if is_head else "  ") + "  ".join(parts)


def _message(role: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"role": role, "content": text, **extra}


def demo(url: str) -> None:
    """A small simulated agent: two conversations with tool calls, a fork and a rewind."""
    store = CheckpointStore.open(url)
    questions = {
        "support-ticket-1042": ["My export to CSV fails", "It says 'quota exceeded'",
                                "Can you raise it?"],
        "research-agent": ["Summarise the BLAKE3 paper", "Compare it with SHA-256",
                           "Which is faster on ARM?"],
    }
    for thread in [*questions, "research-agent/what-if"]:  # a second run starts afresh
        if store.head(thread) is not None:
            store.delete_thread(thread)
    before = store.storage_bytes()
    for thread, asks in questions.items():
        state: dict[str, Any] = {"messages": [_message("system", "You are a helpful agent.")],
                                 "step": 0}
        first = store.save(thread, state, label="start", metadata={"phase": "plan"})
        for i, ask in enumerate(asks, 1):
            state["messages"].append(_message("user", ask))
            state["messages"].append(_message(
                "assistant", "", tool_calls=[{"name": "search", "args": {"q": ask}}]))
            state["step"] = i
            store.save(thread, state, tags=["tool"], metadata={"phase": "act"})
            state["messages"].append(_message("tool", f"results for {ask!r}: " + "lorem " * 60,
                                              name="search"))
            state["messages"].append(_message("assistant", f"Answer {i}: done."))
            store.save(thread, state, label=f"answer-{i}", metadata={"phase": "respond"})
        assert first.id in {c.id for c in store.history(thread)}
    # fork the research thread at its first answer, then rewind the ticket by one step
    answer1 = store.find("research-agent", label="answer-1")[0]
    store.fork("research-agent", answer1.id, "research-agent/what-if")
    branch = store.load("research-agent/what-if").state
    branch["messages"].append(_message("user", "What if we used SHA-3 instead?"))
    store.save("research-agent/what-if", branch, label="what-if")
    last_two = store.history("support-ticket-1042", limit=2)
    store.rewind("support-ticket-1042", last_two[1].id)

    print(f"store: {store.url}\n")
    for thread in store.threads():
        _print_history(store, thread)
        print()
    after = store.storage_bytes()
    unique = {c.id: c.size for t in store.threads() for c in store.history(t)}
    print(f"store size: {_human(after)} on storage ({_human(after - before)} added by this run) "
          f"for {len(unique)} checkpoints whose states add up to {_human(sum(unique.values()))}")


def _verify(args: argparse.Namespace) -> int:
    url: str = args.store
    if "://" not in url and not os.path.isdir(url):
        print(f"cas-checkpoint: error: no store at {url!r} (not a directory)", file=sys.stderr)
        return 2
    options: dict[str, Any] = {}
    if args.endpoint_url:
        options["client_kwargs"] = {"endpoint_url": args.endpoint_url}
    store = CheckpointStore.open(url, storage_options=options)
    last = [0.0]

    def bar(done: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] < 0.1 and done < total:
            return
        last[0] = now
        filled = 30 * done // max(total, 1)
        sys.stderr.write(f"\rverify [{'#' * filled}{'.' * (30 - filled)}] {done}/{total} objects")
        sys.stderr.flush()

    show = args.progress or sys.stderr.isatty()
    report = store.verify(deep=args.deep or args.sample is not None, sample=args.sample,
                          thread_id=args.thread, progress=bar if show else None)
    if show:
        sys.stderr.write("\n")
    print(report.to_json() if args.json else report.to_text())
    return 0 if report.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="cas-checkpoint",
        description="Checkpoints of AI agents in a content-addressed object store.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="run a small simulated agent into a store and show it")
    p.add_argument("store", nargs="?", default="./.cas-demo",
                   help="store URL or directory (default ./.cas-demo)")
    p = sub.add_parser("log", help="print the history of a thread")
    p.add_argument("store")
    p.add_argument("thread")
    p.add_argument("-n", "--limit", type=int, default=None)
    p = sub.add_parser("threads", help="list the threads of a store")
    p.add_argument("store")
    p = sub.add_parser("verify", help="audit a store: exit 0 if intact, 1 if damaged, 2 if "
                       "it could not be read")
    p.add_argument("store")
    p.add_argument("--deep", action="store_true",
                   help="also re-hash the objects of every pack that no checkpoint reaches")
    p.add_argument("--sample", type=float, default=None, metavar="F",
                   help="with --deep (implied): re-hash a random fraction F of those objects")
    p.add_argument("--thread", default=None, help="check this thread only")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--progress", action="store_true",
                   help="show progress on stderr (default: when stderr is a terminal)")
    p.add_argument("--endpoint-url", default=None,
                   help="S3-compatible endpoint; credentials come from the usual AWS_* variables")
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            demo(args.store)
        elif args.command == "log":
            _print_history(CheckpointStore.open(args.store), args.thread, args.limit)
        elif args.command == "verify":
            return _verify(args)
        elif args.command == "threads":
            store = CheckpointStore.open(args.store)
            damaged = 0
            for thread in store.threads():  # one damaged ref does not hide the others
                try:
                    print(f"{thread}\t{store.count(thread)} checkpoints")
                except CasError as exc:
                    damaged += 1
                    print(f"cas-checkpoint: thread {thread!r}: {exc}", file=sys.stderr)
            return 1 if damaged else 0
    except CasError as exc:
        print(f"cas-checkpoint: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
