"""``cas-checkpoint repair-ref``: the way forward when one thread's ref cannot be read (and gc
stops for the whole store): keep a whole slot of a local ref, or remove the ref. It asks for
``--yes`` before it changes anything."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from cas_checkpoint.backends import LocalBackend, ref_slots
from cas_checkpoint.backends.sealed import SealedBackend, unwrap
from cas_checkpoint.cli.common import OK, CliError, emit_json, open_store
from cas_checkpoint.engine.refs import HEADS, thread_key
from cas_checkpoint.humanize import plural


def _slots(backend: LocalBackend, key: str) -> str:
    try:
        with open(os.path.join(backend.root, *key.split("/")), "rb") as f:
            data = f.read(2 * ref_slots.max_file(1 << 20))
    except FileNotFoundError:
        raise CliError(f"{key} does not exist in {backend.root}; check THREAD (or give the "
                       "ref's key as refs/heads/...)") from None
    if not ref_slots.is_slotted(data):
        return f"a ref in one piece of {plural(len(data), 'byte')}"
    try:
        return ref_slots.read(data).describe()
    except ValueError as exc:
        return f"damaged: {exc}"


def cmd_repair_ref(args: argparse.Namespace) -> int:
    if (args.use_slot is None) == (not args.remove):
        raise CliError("give one of --use-slot N (keep that slot's head) or --remove (drop the "
                       "ref)")
    store = open_store(args)
    key = args.thread if args.thread.startswith(HEADS + "/") else thread_key(args.thread)
    if isinstance(store.backend, SealedBackend):
        key = store.backend.ref_key(key)
    backend = unwrap(store.backend)
    if not isinstance(backend, LocalBackend):
        if args.use_slot is not None:
            raise CliError("only refs on local disk have slots; use --remove")
        what = "a ref in one piece"
    else:
        what = _slots(backend, key)
    action = (f"keep the head of slot {args.use_slot}" if args.use_slot is not None
              else "remove the ref (its objects go at the next gc)")
    if not args.yes:
        raise CliError(f"ref {key} holds: {what}. This would {action}, giving up whatever "
                       "else it held; run again with --yes to do it")
    if isinstance(backend, LocalBackend):
        done = backend.repair_ref(key, args.use_slot)
    else:
        backend.delete_many([key])
        done = "removed"
    if args.json:
        emit_json({"ref": key, "held": what, "done": done})
    else:
        print(f"ref {key}: {done} (it held: {what})")
    return OK


def add(cmd: Callable[..., argparse.ArgumentParser]) -> None:
    p = cmd("repair-ref", cmd_repair_ref,
            "keep a whole slot of a damaged local ref, or remove a ref that cannot be read "
            "(asks for --yes)")
    p.add_argument("store")
    p.add_argument("thread",
                   help="thread id, or the ref's key (refs/heads/...) as verify names it")
    p.add_argument("--use-slot", type=int, choices=(0, 1), default=None, metavar="N",
                   help="rewrite the ref with the whole head slot N holds (0 or 1)")
    p.add_argument("--remove", action="store_true", help="remove the ref")
    p.add_argument("--yes", action="store_true", help="do it (without: say what it would do)")
