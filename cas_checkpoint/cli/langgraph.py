"""LangGraph threads on the command line, detected from the store (no flag to remember).

``CasSaver`` keeps each ``(thread_id, checkpoint_ns)`` of LangGraph's in a store thread named
``lg:["<thread_id>","<ns>"]`` that holds two kinds of entries: LangGraph's checkpoints (metadata
``lg``: LangGraph's checkpoint id, ``lgp``: its parent's, ``m``: LangGraph's metadata) and pending
writes (metadata ``w``: the LangGraph checkpoint they belong to, ``task``; no parent), in the
order they were put (a write may land before its checkpoint). Here: telling them apart, naming a
LangGraph thread by its own id (``agent-1``) and a checkpoint by LangGraph's id, the fields a
line shows, and prune's plan for such a thread (keep the pending writes of every kept
checkpoint, and what a DeltaChannel needs to rebuild its value). Nothing here imports LangGraph.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from cas_checkpoint import CheckpointInfo, CheckpointStore, NotFoundError
from cas_checkpoint.cli import common
from cas_checkpoint.cli.common import CliError
from cas_checkpoint.format.objects import CheckpointId
from cas_checkpoint.humanize import human_bytes, plural
from cas_checkpoint.integrations.langgraph_threads import name_of as name_of
from cas_checkpoint.integrations.langgraph_threads import parse_name as parse_name

SPECIAL = {"__interrupt__": "interrupt", "__error__": "error", "__resume__": "resume"}
_LG_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f-]{1,27}")  # LangGraph's uuid-like ids (or a prefix)


def is_checkpoint(info: CheckpointInfo) -> bool:
    return isinstance(info.metadata.get("lg"), str)


def is_write(info: CheckpointInfo) -> bool:
    return not is_checkpoint(info) and isinstance(info.metadata.get("w"), str)


def lg_meta(info: CheckpointInfo) -> dict[str, Any]:
    m = info.metadata.get("m")
    return dict(m) if isinstance(m, Mapping) else {}


@dataclass
class LgThread:
    """A LangGraph thread's entries: its checkpoints newest first (by LangGraph's id, as
    LangGraph lists them), its pending-write entries per checkpoint id, and any other entry."""

    name: str
    thread_id: str
    ns: str
    checkpoints: list[CheckpointInfo]
    writes: dict[str, list[CheckpointInfo]] = field(default_factory=dict)
    other: list[CheckpointInfo] = field(default_factory=list)

    @property
    def write_count(self) -> int:
        return sum(len(w) for w in self.writes.values())

    @property
    def label(self) -> str:
        """How a user names it: ``agent-1``, or ``agent-1`` in namespace ``ns``."""
        return repr(self.thread_id) + (f" (namespace {self.ns!r})" if self.ns else "")

    def back(self, n: int) -> CheckpointInfo:
        """The checkpoint ``n`` LangGraph checkpoints before the latest (pending writes do not
        count)."""
        if n >= len(self.checkpoints):
            raise NotFoundError(f"LangGraph thread {self.label} has "
                                f"{plural(len(self.checkpoints), 'checkpoint')}; ~{n} goes past "
                                "its first")
        return self.checkpoints[n]

    def by_lg_id(self, prefix: str) -> list[CheckpointInfo]:
        return [i for i in self.checkpoints if str(i.metadata["lg"]).startswith(prefix)]


def split(name: str, hist: list[CheckpointInfo]) -> LgThread | None:
    """``hist`` (a thread's entries, newest first) as a LangGraph thread; None if ``name`` is not
    one of CasSaver's or none of its entries is LangGraph's."""
    got = parse_name(name)
    if got is None:
        return None
    cps = [i for i in hist if is_checkpoint(i)]
    writes: dict[str, list[CheckpointInfo]] = {}
    other = []
    for info in hist:
        if is_write(info):
            writes.setdefault(str(info.metadata["w"]), []).append(info)
        elif not is_checkpoint(info):
            other.append(info)
    if not cps and not writes:
        return None
    cps.sort(key=lambda i: str(i.metadata["lg"]), reverse=True)
    return LgThread(name, got[0], got[1], cps, writes, other)


def read(store: CheckpointStore, name: str) -> LgThread | None:
    """The LangGraph view of a store thread (None for any other thread)."""
    if parse_name(name) is None:
        return None
    return split(name, store.history(name))


def open_store(args: argparse.Namespace) -> tuple[CheckpointStore, list[str]]:
    """The store and its threads. A store holding CasSaver's threads is opened with LangGraph's
    types (as ``--types langgraph`` does) when LangGraph is installed and no ``--types`` was
    given: its states hold LangChain messages."""
    store = common.open_store(args)
    threads = store.threads()
    if getattr(args, "types", None) is None and any(parse_name(t) for t in threads):
        try:
            import langgraph  # noqa: F401
        except ImportError:
            return store, threads
        args.types = "langgraph"
        store = common.open_store(args)
    return store, threads


# --- naming threads and checkpoints ---


def thread_name(threads: list[str], spec: str, *, quiet: bool = False) -> str:
    """The store thread ``spec`` names: a thread's own name, or a LangGraph thread id
    (``agent-1`` for ``lg:["agent-1",""]``). With several namespaces, the root one (LangGraph's
    default), and a note on stderr naming the others; ``spec`` itself when nothing matches (the
    command then says it does not exist)."""
    if spec in threads:
        return spec
    found = sorted((got[1], t) for t in threads if (got := parse_name(t)) and got[0] == spec)
    if not found:
        return spec
    if len(found) == 1:
        return found[0][1]
    if found[0][0] != "":
        raise CliError(f"LangGraph thread {spec!r} has no root namespace, only "
                       + ", ".join(repr(ns) for ns, _ in found)
                       + "; name one as " + " or ".join(repr(t) for _, t in found[:3]))
    if not quiet:
        others = found[1:]
        print(f"cas-checkpoint: note: LangGraph thread {spec!r} also has namespace"
              f"{'s' if len(others) > 1 else ''} "
              + ", ".join(repr(ns) for ns, _ in others[:5])
              + (f" and {len(others) - 5} more" if len(others) > 5 else "")
              + f"; this is its root namespace {found[0][1]!r}; to pick another, name it in "
              f"full, e.g. '{others[0][1]}'", file=sys.stderr)
    return found[0][1]


def resolve(store: CheckpointStore, spec: str, thread: str | None = None,
            threads: list[str] | None = None) -> CheckpointInfo:
    """``common.resolve``, LangGraph-aware: a LangGraph thread id names its thread; in a
    LangGraph thread the head and ``~N`` count LangGraph's checkpoints only (not pending
    writes); LangGraph's checkpoint ids (or a unique prefix with its first dash) are accepted
    beside the store's."""
    threads = store.threads() if threads is None else threads
    if thread is not None:
        name = thread_name(threads, thread)
        lgt = read(store, name)
        if lgt is not None:
            if re.fullmatch(r"~\d+", spec):
                return lgt.back(int(spec[1:]))
            if _LG_ID.fullmatch(spec):
                return _one(lgt.by_lg_id(spec), spec, f"in LangGraph thread {lgt.label}")
        return common.resolve(store, spec, thread=name)
    base, tilde, n = spec.rpartition("~")
    back = int(n) if tilde and n.isdigit() and spec not in threads else None
    name = thread_name(threads, spec if back is None else base)
    if name in threads:
        lgt = read(store, name)
        if lgt is not None:
            return lgt.back(back or 0)
        return common.resolve(store, name if back is None else f"{name}~{back}")
    if _LG_ID.fullmatch(spec):
        found = [i for t in threads if (lgt := read(store, t)) for i in lgt.by_lg_id(spec)]
        return _one(found, spec, "in any LangGraph thread")
    try:
        return common.resolve(store, spec)
    except NotFoundError:
        if not re.fullmatch(r"[0-9a-f]{4,}", spec):
            raise
        found = [i for t in threads if (lgt := read(store, t)) for i in lgt.by_lg_id(spec)]
        if not found:
            raise
        return _one(found, spec, "in any LangGraph thread")


def _one(found: list[CheckpointInfo], spec: str, where: str) -> CheckpointInfo:
    if not found:
        raise NotFoundError(f"no LangGraph checkpoint id starts with {spec!r} {where}; "
                            "`cas-checkpoint log STORE THREAD` lists them")
    if len(found) > 1:
        ids = sorted({f"{i.metadata['lg']} in {i.thread_id!r}" for i in found})
        raise CliError(f"{spec!r} names {len(found)} LangGraph checkpoints {where} ("
                       + ", ".join(ids[:4]) + "); give more of the id, or name the thread: "
                       "show STORE THREAD CHECKPOINT")
    return found[0]


# --- what a line shows ---


def next_nodes(state: Any) -> list[str]:
    """The nodes a LangGraph checkpoint triggers next: StateGraph routes to a node through
    its ``branch:to:NODE`` channel (``__start__`` takes the input); Send packets are ``Send``."""
    values = state.get("channel_values") if isinstance(state, Mapping) else None
    if not isinstance(values, Mapping):
        return []
    out = [k[len("branch:to:"):] for k in values if isinstance(k, str)
           and k.startswith("branch:to:")]
    if "__start__" in values:
        out.insert(0, "__start__")
    if values.get("__pregel_tasks"):
        out.append("Send")
    return out


def message_count(state: Any) -> int | None:
    """``len(channel_values["messages"])`` of a LangGraph checkpoint, when it is a list."""
    values = state.get("channel_values") if isinstance(state, Mapping) else None
    got = values.get("messages") if isinstance(values, Mapping) else None
    return len(got) if isinstance(got, list | tuple) else None


def write_kinds(states: Iterable[Any]) -> list[str]:
    """What special writes (interrupt, error, resume) pending-write entries hold."""
    out: list[str] = []
    for state in states:
        items = state.get("writes") if isinstance(state, Mapping) else None
        for item in items if isinstance(items, list) else ():
            if isinstance(item, list | tuple) and len(item) == 3 and item[1] in SPECIAL:
                out.append(SPECIAL[item[1]])
    return out


def fields(info: CheckpointInfo, *, nodes: list[str] | None = None,
           writes: int = 0, kinds: Iterable[str] = ()) -> dict[str, Any]:
    """A LangGraph checkpoint's fields, for ``--json``."""
    m = lg_meta(info)
    return {"checkpoint_id": info.metadata.get("lg"),
            "parent_checkpoint_id": info.metadata.get("lgp"), "step": m.get("step"),
            "source": m.get("source"), "next": nodes, "pending_writes": writes,
            "special_writes": sorted(set(kinds)), "metadata": m}


def line(info: CheckpointInfo, *, nodes: list[str] | None = None, writes: int = 0,
         kinds: Iterable[str] = ()) -> str:
    """One line for a LangGraph checkpoint: LangGraph's step, source and next nodes, its
    pending writes, its metadata as fields, LangGraph's id; the store's id first."""
    m = lg_meta(info)
    step = m.get("step")
    parts = [info.id[:12], f"step {step:>3}" if isinstance(step, int) else "step   ?",
             info.created_at.strftime("%Y-%m-%d %H:%M:%S"), human_bytes(info.size).rjust(8),
             str(m.get("source", "?")).ljust(6)]
    if nodes is not None:
        parts.append("next " + (",".join(nodes) if nodes else "-"))
    kinds = sorted(set(kinds))
    parts.append(f"writes {writes}" + (f" ({', '.join(kinds)})" if kinds else ""))
    if info.label:
        parts.append(f"label={info.label}")
    if info.tags:
        parts.append("tags=" + ",".join(info.tags))
    for key, value in m.items():
        if key in ("step", "source") or (key == "parents" and not value):
            continue
        text = value if isinstance(value, str) else json.dumps(value, default=repr)
        parts.append(f"{key}={text if len(text) <= 60 else text[:60] + '...'}")
    parts.append(f"checkpoint_id={info.metadata.get('lg')}")
    return "  ".join(parts)


def header(lgt: LgThread) -> str:
    return (f"LangGraph thread {lgt.label}: {plural(len(lgt.checkpoints), 'checkpoint')}, "
            f"{plural(lgt.write_count, 'pending write')}")


# --- prune ---


@dataclass
class Plan:
    """What prune keeps and removes in a LangGraph thread, and why each checkpoint stays."""

    kept: list[CheckpointInfo]
    removed: list[CheckpointInfo]
    kept_writes: list[CheckpointInfo]
    removed_writes: list[CheckpointInfo]
    reasons: dict[str, int]

    @property
    def remove_ids(self) -> set[CheckpointId]:
        return {i.id for i in self.removed + self.removed_writes}


def plan(lgt: LgThread, *, keep_last: int | None, older_than: timedelta | None,
         keep_labeled: bool, keep_tags: Iterable[str], now: float | None = None) -> Plan:
    """Kept: the latest checkpoint (what LangGraph resumes from), the last ``keep_last``,
    those newer than ``older_than``, labelled (with ``keep_labeled``) or tagged ones; then
    every ancestor a kept checkpoint's DeltaChannel values are rebuilt from (up to the
    checkpoint where each was last snapshotted, as its ``counters_since_delta_snapshot``
    says); then the pending writes of every kept checkpoint (interrupts, resumes, the writes
    of finished tasks) and any write whose checkpoint is not in the thread (it may be landing
    now). Everything else goes."""
    now = time.time() if now is None else now
    cutoff = None if older_than is None else now - older_than.total_seconds()
    tags = frozenset(keep_tags)
    keep: dict[str, str] = {}
    for n, info in enumerate(lgt.checkpoints):
        rule = ("head" if n == 0
                else "last" if keep_last is not None and n < keep_last
                else "recent" if cutoff is not None and info.created_at.timestamp() >= cutoff
                else "labeled" if keep_labeled and info.label is not None
                else "tagged" if tags.intersection(info.tags)
                else None)
        if rule is not None:
            keep[str(info.metadata["lg"])] = rule
    by_lg = {str(i.metadata["lg"]): i for i in lgt.checkpoints}
    for lg in list(keep):
        needs = set(_delta_counters(by_lg[lg]))
        cursor = by_lg[lg].metadata.get("lgp")
        seen = {lg}
        while needs and isinstance(cursor, str) and cursor in by_lg and cursor not in seen:
            seen.add(cursor)
            keep.setdefault(cursor, "delta")
            needs &= set(_delta_counters(by_lg[cursor]))
            cursor = by_lg[cursor].metadata.get("lgp")
    kept = [i for i in lgt.checkpoints if str(i.metadata["lg"]) in keep]
    removed = [i for i in lgt.checkpoints if str(i.metadata["lg"]) not in keep]
    kept_writes: list[CheckpointInfo] = []
    removed_writes: list[CheckpointInfo] = []
    for lg, entries in lgt.writes.items():
        (kept_writes if lg in keep or lg not in by_lg else removed_writes).extend(entries)
    reasons: dict[str, int] = {}
    for rule in keep.values():
        reasons[rule] = reasons.get(rule, 0) + 1
    return Plan(kept, removed, kept_writes, removed_writes, reasons)


def _delta_counters(info: CheckpointInfo) -> list[str]:
    """The DeltaChannels updated since their last snapshot at this checkpoint."""
    got = lg_meta(info).get("counters_since_delta_snapshot")
    return [str(k) for k in got] if isinstance(got, Mapping) else []


def remove(store: CheckpointStore, name: str, ids: set[CheckpointId]) -> None:
    """Remove exactly these entries from a thread's log, in one compare-and-swap (refs only; the
    objects stay until repack and gc). Entries saved meanwhile stay."""
    if ids:
        store.delete(name, *sorted(ids))


# --- history edits ---


def with_writes(lgt: LgThread, infos: Iterable[CheckpointInfo]) -> set[CheckpointId]:
    """These checkpoints' entries and their pending writes' entries."""
    ids: set[CheckpointId] = set()
    for info in infos:
        ids.add(info.id)
        ids.update(w.id for w in lgt.writes.get(str(info.metadata.get("lg")), []))
    return ids


def newer(lgt: LgThread, info: CheckpointInfo) -> list[CheckpointInfo]:
    """The checkpoints LangGraph put after ``info`` (its ids grow with time)."""
    return [i for i in lgt.checkpoints if str(i.metadata["lg"]) > str(info.metadata["lg"])]


def namespaces(threads: list[str], spec: str) -> list[str]:
    """Every store thread of LangGraph thread ``spec`` (one per namespace), or ``[spec]``."""
    if spec in threads:
        return [spec]
    return sorted(t for t in threads if (got := parse_name(t)) and got[0] == spec) or [spec]
