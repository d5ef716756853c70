"""The ``cas-checkpoint`` parser and its error handling: exit 0 when all is well, 1 when a command
found problems (``verify``, a damaged ref in ``threads``), 2 on an error (one line on stderr;
``--debug`` adds the traceback), 130 when interrupted."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence

from cas_checkpoint import CasError
from cas_checkpoint.cli import demo, move, read, repair, ui, write
from cas_checkpoint.cli.common import (
    ERROR,
    CliError,
    add_store_options,
    count,
    duration,
    positive_int,
)
from cas_checkpoint.cli.wording import for_cli

Command = Callable[[argparse.Namespace], int]


def _version() -> str:
    """The installed distribution's version (the checkout's, run from a source tree)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cas_checkpoint")
    except PackageNotFoundError:
        return "(not installed: run from a source tree)"


def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("output")
    g.add_argument("--json", action="store_true", help="print JSON (stable keys) on stdout")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    g.add_argument("-v", "--verbose", action="store_true",
                   help="after a summary, list the details (each thread, checkpoint, pack)")
    g.add_argument("--progress", action="store_true",
                   help="draw progress bars even when stderr is not a terminal")
    g.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    add_store_options(p)
    return p


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="cas-checkpoint",
        description="Checkpoints of AI agents in a content-addressed object store. STORE is a "
        "directory, memory://name or s3://bucket/prefix.",
        epilog="Exit status: 0 ok, 1 problems found (verify), 2 error.")
    top.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _common()

    def cmd(name: str, fn: Command, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, parents=[common])
        p.set_defaults(fn=fn)
        return p

    p = cmd("demo", demo.cmd_demo, "run a 200-step agent with a fork and a rewind into a store "
            "and show what it stores")
    p.add_argument("store", nargs="?", default="./.cas-demo",
                   help="store URL or directory (default ./.cas-demo)")
    p = cmd("init", write.cmd_init, "create a store (read commands never do)")
    p.add_argument("store")
    p.add_argument("--compression", choices=["none", "zstd"], default=None,
                   help="zstd (the default for a new store) or none (kept as the store's setting)")
    p.add_argument("--level", type=int, default=None, help="zstd level, 1-19 (default 3)")

    cmd("keygen", write.cmd_keygen, "print a new random key (base64) for CAS_KEY or a "
        "--key-file; its id goes to stderr")

    p = cmd("rekey", write.cmd_rekey, "rewrite an encrypted store's packs and refs under a new "
            "key (--key-file NEW --key-file OLD)")
    p.add_argument("store")

    p = cmd("threads", read.cmd_threads, "list the threads of a store")
    p.add_argument("store")
    p.add_argument("--bytes", action="store_true",
                   help="also the bytes each thread's packs take (reads every thread's packs "
                   "list and head state)")
    p.add_argument("--names", action="store_true",
                   help="only the thread ids, one a line, unsorted, printed a page of the "
                   "listing at a time (reads no ref but long ids': for a store of millions)")
    p = cmd("log", read.cmd_log, "print the history of a thread, newest first")
    p.add_argument("store")
    p.add_argument("thread")
    p.add_argument("-n", "--limit", type=positive_int, default=None)
    p.add_argument("--graph", action="store_true",
                   help="draw the parent DAG like `git log --graph`; mark where other threads "
                   "fork off")
    for flag in ("label", "tag", "status", "kind"):
        p.add_argument(f"--{flag}", default=None, help=f"only checkpoints with this {flag}")
    p = cmd("show", read.cmd_show, "print a checkpoint's metadata and state")
    p.add_argument("store")
    p.add_argument("target", nargs="?", default=None, metavar="THREAD|CHECKPOINT",
                   help="a thread (its head), THREAD~N, or a checkpoint id (a unique prefix "
                   "of 4+ hex digits will do)")
    p.add_argument("checkpoint", nargs="?", default=None,
                   help="with THREAD: a checkpoint id (prefix) or ~N in that thread")
    p.add_argument("--path", default=None,
                   help="show only this part of the state, e.g. 'messages[-1]' or "
                   "'messages[3].content'")
    p.add_argument("--full", action="store_true", help="do not elide long strings and lists")
    p.add_argument("--state-only", action="store_true", help="print the state alone")
    p = cmd("diff", read.cmd_diff, "what changed between two checkpoints (any threads); reads "
            "only the parts of the trees that differ")
    p.add_argument("store")
    p.add_argument("a", help="checkpoint id (prefix), thread (its head) or THREAD~N")
    p.add_argument("b", help="the same, for the other side")
    p.add_argument("--thread", default=None, help="look A and B up in this thread")
    p = cmd("stats", read.cmd_stats, "logical vs stored bytes, dedup ratio, objects")
    p.add_argument("store")
    p.add_argument("--by-thread", action="store_true", help="also per thread")
    p = cmd("search", read.cmd_search, "find text in states (case-insensitive); every shared "
            "part is read once")
    p.add_argument("store")
    p.add_argument("query")
    p.add_argument("--regex", action="store_true", help="QUERY is a Python regular expression")
    p.add_argument("--thread", default=None, help="search this thread only")
    p.add_argument("--all-history", action="store_true",
                   help="search every checkpoint, not only each thread's head")
    p.add_argument("-n", "--limit", type=positive_int, default=None, help="stop after N matches")
    p = cmd("verify", read.cmd_verify, "audit a store: exit 0 if intact, 1 if damaged, 2 if it "
            "could not be read")
    p.add_argument("store")
    p.add_argument("--deep", action="store_true",
                   help="read and re-hash every pack and every object in it (without it: "
                   "the refs, and each pack they name present at its size, from a listing)")
    p.add_argument("--sample", type=float, default=None, metavar="F",
                   help="with --deep (implied): re-hash a random fraction F of those objects")
    p.add_argument("--thread", default=None, help="check this thread only")

    p = cmd("fork", write.cmd_fork, "start a new thread at a checkpoint (no state copied)")
    p.add_argument("store")
    p.add_argument("thread")
    p.add_argument("checkpoint", help="checkpoint id (prefix) or ~N in THREAD")
    p.add_argument("new_thread")
    p = cmd("rewind", write.cmd_rewind, "move a thread's head back to a checkpoint")
    p.add_argument("store")
    p.add_argument("thread")
    p.add_argument("checkpoint", help="checkpoint id (prefix) or ~N in THREAD")
    p = cmd("delete", write.cmd_delete, "remove one checkpoint from a thread")
    p.add_argument("store")
    p.add_argument("thread")
    p.add_argument("checkpoint", help="checkpoint id (prefix) or ~N in THREAD")
    p = cmd("delete-thread", write.cmd_delete_thread, "remove a thread (objects stay until gc)")
    p.add_argument("store")
    p.add_argument("thread")
    repair.add(cmd)
    p = cmd("prune", write.cmd_prune, "drop old checkpoints from threads' histories")
    p.add_argument("store")
    p.add_argument("thread", nargs="?", default=None, help="one thread (default: every thread)")
    p.add_argument("--keep-last", type=count, default=None, metavar="N",
                   help="keep each thread's last N checkpoints")
    p.add_argument("--older-than", type=duration, default=None, metavar="AGE",
                   help="drop checkpoints older than AGE (30m, 12h, 7d, 2w)")
    p.add_argument("--keep-labeled", action=argparse.BooleanOptionalAction, default=True,
                   help="keep labelled checkpoints (default: yes)")
    p.add_argument("--keep-tag", action="append", default=[], metavar="TAG",
                   help="keep checkpoints with this tag (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="print what would go; change nothing")
    p = cmd("expire", write.cmd_expire, "delete threads nobody saved to for a while (gc then "
            "reclaims their bytes)")
    p.add_argument("store")
    p.add_argument("thread", nargs="?", default=None, help="one thread (default: every thread)")
    p.add_argument("--idle", type=duration, required=True, metavar="AGE",
                   help="expire threads neither saved to nor written for AGE (30m, 12h, 7d, 2w)")
    p.add_argument("--keep-labeled", action=argparse.BooleanOptionalAction, default=False,
                   help="keep threads that have a labelled checkpoint (default: no)")
    p.add_argument("--keep-tag", action="append", default=[], metavar="TAG",
                   help="keep threads with a checkpoint tagged TAG (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="print what would go; change nothing")
    p = cmd("gc", write.cmd_gc, "repack, then delete what no checkpoint reaches (safe while "
            "agents write)")
    p.add_argument("store")
    p.add_argument("--grace", type=duration, default=duration("1h"), metavar="AGE",
                   help="keep unreachable objects younger than this (default 1h)")
    p.add_argument("--dry-run", action="store_true", help="print what would go; change nothing")
    p.add_argument("--no-repack", dest="repack", action="store_false",
                   help="skip the repack of packs that hold garbage")
    p.add_argument("--force", action="store_true", help="allow a grace under 1 s on S3")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="sharded gc: read share I of N of the refs and write its mark; delete "
                        "nothing (run I = 1..N, anywhere, then --from-marks once)")
    p.add_argument("--from-marks", action="store_true",
                   help="sharded gc: delete, taking the refs from the marks of every share "
                        "(no repack)")

    p = cmd("export", move.cmd_export, "write a thread and everything it reaches to one file")
    p.add_argument("store")
    p.add_argument("thread")
    p.add_argument("file")
    p = cmd("import", move.cmd_import, "read a bundle file into a store, verifying every object")
    p.add_argument("store")
    p.add_argument("file")
    p.add_argument("--as", dest="as_thread", default=None, metavar="THREAD",
                   help="import under this thread id")
    p = cmd("copy", move.cmd_copy, "copy threads between stores, writing only what is missing "
            "(run again to resume)")
    p.add_argument("store", metavar="SRC")
    p.add_argument("dest", metavar="DST")
    p.add_argument("threads", nargs="*", metavar="THREAD", help="default: every thread")
    ui.add(cmd)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse has printed
        return exc.code if isinstance(exc.code, int) else ERROR
    try:
        return int(args.fn(args))
    except (CasError, CliError) as exc:
        if args.debug:
            traceback.print_exc()
        print(f"cas-checkpoint: error: {for_cli(str(exc))}", file=sys.stderr)
        return ERROR
    except KeyboardInterrupt:
        print("cas-checkpoint: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `cas-checkpoint log ... | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # noqa: BLE001 - a bug or an unexpected failure: one line
        if args.debug:
            traceback.print_exc()
        print(f"cas-checkpoint: error: {type(exc).__name__}: {exc} (--debug shows where)",
              file=sys.stderr)
        return ERROR
