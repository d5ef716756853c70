"""Commands that change a store: init, fork, rewind, delete, delete-thread, prune, expire, gc.
Each names what it changed; ``--dry-run`` (prune, expire, gc) changes nothing and says what
would go."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cas_checkpoint import CheckpointStore, Key, NotFoundError, PruneReport
from cas_checkpoint.cli import langgraph as lg
from cas_checkpoint.cli.common import (
    OK,
    CliError,
    emit_json,
    encryption,
    info_dict,
    open_store,
    storage_options,
)
from cas_checkpoint.cli.progress import bar
from cas_checkpoint.cli.wording import for_cli
from cas_checkpoint.humanize import human_bytes, plural
from cas_checkpoint.integrations.langgraph_threads import thread_of


def cmd_init(args: argparse.Namespace) -> int:
    try:
        open_store(args)
        existed = True
    except NotFoundError:
        existed = False
    store = CheckpointStore.init(args.store, storage_options=storage_options(args),
                                 compression=args.compression, compression_level=args.level,
                                 encryption=encryption(args))
    settings = store.settings()
    how = (f"zstd level {settings['compression_level']}" if settings["compression"] else
           "no compression")
    if args.json:
        emit_json({"store": store.url, "created": not existed, **settings})
    else:
        print(f"{'a store is already there' if existed else 'created a store'}: {store.url} "
              f"({how})")
    return OK


def cmd_fork(args: argparse.Namespace) -> int:
    store, threads = lg.open_store(args)
    name = lg.thread_name(threads, args.thread)
    at = lg.resolve(store, args.checkpoint, thread=args.thread, threads=threads)
    new, got = args.new_thread, lg.parse_name(name)
    if got is not None and lg.is_checkpoint(at) and lg.parse_name(new) is None:
        new = lg.name_of(new, got[1])  # a LangGraph thread forks into a LangGraph thread
    info = store.fork(name, at.id, new)
    if args.json:
        emit_json({"thread": new, "head": info_dict(info)})
    elif lg.is_checkpoint(at):
        print(f"forked LangGraph thread {args.thread!r} at checkpoint {at.metadata['lg']} "
              f"(step {lg.lg_meta(at).get('step')}) into {new!r} (LangGraph thread id "
              f"{args.new_thread!r}); no state copied, no pending writes carried")
    else:
        print(f"forked {name!r} at {at.id[:12]} (step {at.step}) into {new!r}; no state copied")
    return OK


def cmd_rewind(args: argparse.Namespace) -> int:
    store, threads = lg.open_store(args)
    name = lg.thread_name(threads, args.thread)
    at = lg.resolve(store, args.checkpoint, thread=args.thread, threads=threads)
    lgt = lg.read(store, name) if lg.is_checkpoint(at) else None
    if lgt is not None:  # LangGraph's later checkpoints go with their writes; at's writes stay
        later = lg.newer(lgt, at)
        ids = lg.with_writes(lgt, later)
        if ids:
            store.delete(name, *sorted(ids))
        if args.json:
            emit_json({"thread": name, "checkpoint_id": at.metadata["lg"],
                       "head": info_dict(at), "left_the_thread": len(later),
                       "pending_writes_left": len(ids) - len(later)})
        else:
            print(f"LangGraph thread {lgt.label} now ends at checkpoint {at.metadata['lg']} "
                  f"(step {lg.lg_meta(at).get('step')}); {plural(len(later), 'checkpoint')} "
                  f"and {plural(len(ids) - len(later), 'pending write')} left the thread (their "
                  "objects stay until gc)")
        return OK
    before = store.count(name)
    info = store.rewind(name, at.id)
    dropped = before - store.count(name)
    if args.json:
        emit_json({"thread": name, "head": info_dict(info), "left_the_thread": dropped})
    else:
        print(f"{name!r} now ends at {at.id[:12]} (step {at.step}); "
              f"{plural(dropped, 'checkpoint')} left the thread (their objects stay until gc)")
    return OK


def cmd_delete(args: argparse.Namespace) -> int:
    store, threads = lg.open_store(args)
    name = lg.thread_name(threads, args.thread)
    at = lg.resolve(store, args.checkpoint, thread=args.thread, threads=threads)
    lgt = lg.read(store, name) if lg.is_checkpoint(at) else None
    ids = lg.with_writes(lgt, [at]) if lgt is not None else {at.id}
    store.delete(name, *sorted(ids))
    if args.json:
        emit_json({"thread": name, "deleted": at.id, "pending_writes_deleted": len(ids) - 1,
                   **({"checkpoint_id": at.metadata["lg"]} if lgt is not None else {})})
    elif lgt is not None:
        print(f"deleted LangGraph checkpoint {at.metadata['lg']} ({at.id[:12]}) and its "
              f"{plural(len(ids) - 1, 'pending write')} from {lgt.label} (objects stay until gc)")
    else:
        print(f"deleted {at.id[:12]} from {name!r} (its objects stay until gc)")
    return OK


def cmd_delete_thread(args: argparse.Namespace) -> int:
    """A LangGraph thread id deletes every namespace of that thread, as LangGraph's
    ``delete_thread`` does."""
    store, threads = lg.open_store(args)
    names = lg.namespaces(threads, args.thread)
    counts = {name: store.count(name) for name in names}
    for name in names:
        store.delete_thread(name)
    n = sum(counts.values())
    if args.json:
        emit_json({"thread": args.thread, "deleted": True, "checkpoints": n,
                   "threads": sorted(counts)})
    elif names != [args.thread]:
        print(f"deleted LangGraph thread {args.thread!r}: {plural(len(names), 'namespace')} "
              f"({', '.join(repr(t) for t in names)}), {plural(n, 'entry', 'entries')} "
              "(checkpoints and pending writes; objects stay until gc)")
    else:
        print(f"deleted thread {args.thread!r} ({plural(n, 'checkpoint')}; objects stay until "
              "gc)")
    return OK


def cmd_prune(args: argparse.Namespace) -> int:
    if args.keep_last is None and args.older_than is None:
        raise CliError("say what to keep: --keep-last N and/or --older-than DURATION "
                       "(checkpoints older than that go)")
    store = open_store(args)
    listed = store.threads()
    threads = [lg.thread_name(listed, args.thread)] if args.thread else listed
    total = PruneReport(dry_run=args.dry_run)
    plans: dict[str, lg.Plan] = {}
    with bar(args, "prune", "threads") as progress:
        for n, thread in enumerate(threads, 1):
            lgt = lg.read(store, thread)
            if lgt is not None:  # LangGraph's checkpoints, with their pending writes
                plans[thread] = plan = lg.plan(
                    lgt, keep_last=args.keep_last, older_than=args.older_than,
                    keep_labeled=args.keep_labeled, keep_tags=args.keep_tag)
                if not args.dry_run:
                    lg.remove(store, thread, plan.remove_ids)
            else:
                report = store.prune(thread, keep_last=args.keep_last,
                                     older_than=args.older_than,
                                     keep_labeled=args.keep_labeled, keep_tags=args.keep_tag,
                                     dry_run=args.dry_run)
                total.threads.update(report.threads)
            if progress:
                progress(n, len(threads))
    if args.json:
        out: dict[str, dict[str, Any]] = {
            t: {"kept": list(p.kept), "removed": list(p.removed)}
            for t, p in total.threads.items()}
        reasons = total.reasons
        for t, pl in plans.items():
            out[t] = {"kept": [i.id for i in pl.kept], "removed": [i.id for i in pl.removed],
                      "kept_pending_writes": [i.id for i in pl.kept_writes],
                      "removed_pending_writes": [i.id for i in pl.removed_writes],
                      "kept_checkpoint_ids": [i.metadata["lg"] for i in pl.kept],
                      "removed_checkpoint_ids": [i.metadata["lg"] for i in pl.removed],
                      "reasons": pl.reasons}
            for rule, k in pl.reasons.items():
                reasons[rule] = reasons.get(rule, 0) + k
        emit_json({"dry_run": args.dry_run,
                   "kept": total.kept + sum(len(p.kept) for p in plans.values()),
                   "removed": total.removed + sum(len(p.removed) for p in plans.values()),
                   "reasons": reasons, "threads": dict(sorted(out.items()))})
        return OK
    _prune_text(args, total, plans)
    return OK


def _prune_text(args: argparse.Namespace, total: PruneReport, plans: dict[str, lg.Plan]
                ) -> None:
    """The totals first; each thread's line and (dry run) each checkpoint only with -v."""
    verb = "would remove" if args.dry_run else "removed"
    if total.threads or not plans:
        print(for_cli(total.to_text(by_thread=False)))
    if plans:
        every = list(plans.values())
        print(f"LangGraph threads: kept {plural(sum(len(p.kept) for p in every), 'checkpoint')} "
              f"and {plural(sum(len(p.kept_writes) for p in every), 'pending write')}, {verb} "
              f"{plural(sum(len(p.removed) for p in every), 'checkpoint')} and "
              f"{plural(sum(len(p.removed_writes) for p in every), 'pending write')} in "
              f"{plural(len(plans), 'thread')}")
    removed = total.removed + sum(len(p.removed) for p in plans.values())
    if not args.verbose:
        if len(total.threads) + len(plans) > 1 or (args.dry_run and removed):
            print("(-v lists each thread" + (" and each checkpoint that would go" if
                                             args.dry_run and removed else "")
                  + "; --json too)")
        return
    for line in total.to_text().splitlines()[1:]:
        print(line)
    for t, pl in sorted(plans.items()):
        why = ", ".join(f"{n} {rule}" for rule, n in pl.reasons.items())
        print(f"{t}: kept {plural(len(pl.kept), 'LangGraph checkpoint')} ({why or 'none'}) and "
              f"their {plural(len(pl.kept_writes), 'pending write')}, {verb} "
              f"{plural(len(pl.removed), 'checkpoint')} and "
              f"{plural(len(pl.removed_writes), 'pending write')}")
    if args.dry_run:
        for t, p in sorted(total.threads.items()):
            for cid in p.removed:
                print(f"would remove {t}  {cid[:12]}")
        for t, pl in sorted(plans.items()):
            for info in pl.removed:
                print(f"would remove {t}  {info.id[:12]}  LangGraph checkpoint "
                      f"{info.metadata['lg']} (step {lg.lg_meta(info).get('step')})")


def cmd_expire(args: argparse.Namespace) -> int:
    """Delete the refs of idle threads: the totals first; each thread with -v."""
    store = open_store(args)
    thread = lg.thread_name(store.threads(), args.thread) if args.thread else None
    report = store.expire(idle_for=args.idle, dry_run=args.dry_run,
                          keep_labeled=args.keep_labeled, keep_tags=args.keep_tag,
                          thread_id=thread, group=thread_of)  # (a LangGraph thread's
    # namespaces expire together)
    if args.json:
        emit_json(report.to_dict())
        return OK
    print(for_cli(report.to_text(by_thread=args.verbose)))
    if not args.verbose and report.expired:
        print("(-v lists each thread" + (" that would go" if args.dry_run else "")
              + "; --json too)")
    return OK


def _shard(text: str) -> tuple[int, int]:
    i, sep, n = text.partition("/")
    if not sep or not i.isdigit() or not n.isdigit() or not 1 <= int(i) <= int(n):
        raise CliError(f"--shard takes I/N, share I of N with 1 <= I <= N (e.g. --shard 2/8), "
                       f"not {text!r}")
    return int(i), int(n)


def cmd_gc(args: argparse.Namespace) -> int:
    shard = getattr(args, "shard", None)
    from_marks = getattr(args, "from_marks", False)
    if shard is not None and (from_marks or args.dry_run):
        raise CliError("--shard writes one share's mark and deletes nothing: run it without "
                       "--from-marks and --dry-run, then `gc STORE --from-marks` once")
    store = open_store(args)
    if shard is not None:
        i, n = _shard(shard)
        marked = store.gc_mark(shard=i, of=n)
        if args.json:
            emit_json(marked.to_dict())
        else:
            print(for_cli(marked.to_text()))
        return OK
    # a repack rewrites packs: it needs the key; from marks, it would read every thread here
    repack = args.repack and not args.keyless and not from_marks
    with bar(args, "gc") as progress:  # (arguments checked first; a dry run predicts the run)
        report = store.gc(grace=args.grace, dry_run=args.dry_run, progress=progress,
                          force=args.force, repack=repack, from_marks=from_marks)
    repacked = report.repack
    if args.json:
        out = report.to_dict()
        if args.dry_run:
            out["would_delete"] = list(report.deleted)
        emit_json(out)
        return OK
    verb = "would free" if args.dry_run else "freed"
    print(f"{verb} {human_bytes(report.deleted_bytes)}")
    print(for_cli(report.to_text()))
    if repacked is not None:
        print(for_cli(repacked.to_text()))
    if args.dry_run and report.deleted:
        if not args.verbose:
            print(f"(-v lists the {plural(len(report.deleted), 'pack')} that would go; "
                  "--json too)")
        else:
            for oid in report.deleted:
                print(f"would delete pack {oid}")
    return OK


def cmd_rekey(args: argparse.Namespace) -> int:
    """Rewrite every thread under the first key given (``--key-file NEW --key-file OLD``, or
    ``CAS_KEY=NEW,OLD``); afterwards the old keys are no longer needed."""
    if not isinstance(encryption(args), list):
        raise CliError("rekey needs the keys: --key-file NEW --key-file OLD (or CAS_KEY=NEW,OLD)")
    report = open_store(args).rekey()
    if args.json:
        emit_json(report)
    else:
        print(f"rekeyed {plural(report['threads'], 'thread')} under key id {report['key_id']}: "
              f"{plural(report['packs_rewritten'], 'pack')} rewritten "
              f"({plural(report['bytes_written'], 'byte')}); "
              f"retired key ids: {', '.join(report['retired_key_ids']) or 'none'}; run "
              "`cas-checkpoint gc` to delete the old packs")
    return OK


def cmd_keygen(args: argparse.Namespace) -> int:
    """A new key: its text on stdout (``CAS_KEY=$(cas-checkpoint keygen)``), its id on stderr."""
    key = Key.generate()
    if args.json:
        emit_json({"key": key.to_text(), "key_id": key.id})
    else:
        print(key.to_text())
        print(f"key id {key.id}: keep the key secret; a lost key cannot be recovered",
              file=sys.stderr)
    return OK
