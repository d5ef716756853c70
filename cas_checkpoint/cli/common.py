"""What every command shares: opening a store from the command line's options, naming a
checkpoint (full id, short id, thread head, ``THREAD~N``), durations, JSON output. Public API
only."""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import sys
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from cas_checkpoint import (
    CheckpointInfo,
    CheckpointStore,
    InvalidArgumentError,
    Key,
    NotFoundError,
    TypeRegistry,
)
from cas_checkpoint.humanize import plural
from cas_checkpoint.query.walk import Stored

OK, PROBLEMS, ERROR = 0, 1, 2  # exit codes


class CliError(Exception):
    """A usage error found by the command line itself (exit 2, one line, no traceback)."""


def add_store_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("storage (any command)")
    g.add_argument("--endpoint-url", metavar="URL",
                   help="S3-compatible endpoint (MinIO, R2, moto...); or set AWS_ENDPOINT_URL")
    g.add_argument("--profile", help="AWS profile for s3:// stores (or set AWS_PROFILE)")
    g.add_argument("--region", help="AWS region for s3:// stores (or set AWS_REGION)")
    g.add_argument("--storage-option", action="append", default=[], metavar="K=V",
                   help="an fsspec storage option (repeatable; V parsed as JSON if it can be, "
                   "e.g. anon=true)")
    g.add_argument("--timeout", type=seconds, default=None, metavar="SECONDS",
                   help="s3:// stores: how long one request may wait to connect, and for each "
                   "read of its answer, before it fails (default 30)")
    g.add_argument("--retries", type=attempts, default=None, metavar="N",
                   help="s3:// stores: attempts at a failing request, 1-100 (default 6; an "
                   "endpoint that never answered is tried once). A request gives up after "
                   "about N x SECONDS plus a few seconds of backoff")
    g.add_argument("--types", choices=["langgraph"], default=None,
                   help="decode the types this framework stores (langgraph: LangChain messages, "
                   "Send, Command...; needs `pip install 'cas_checkpoint[langgraph]'`)")
    g.add_argument("--key-file", action="append", default=[], metavar="FILE",
                   help="the key of an encrypted store (base64 or hex text); repeat it while "
                   "rotating keys: the first writes, all read. Default: the CAS_KEY environment "
                   "variable (comma-separated keys, the first writes)")
    g.add_argument("--keyless", action="store_true",
                   help="open an encrypted store without its key: gc and verify (not --deep) "
                   "only, from the refs' clear pack lists and the packs' names")


def encryption(args: argparse.Namespace) -> list[Key] | str | None:
    """The keys given by ``--key-file`` (or else ``CAS_KEY``), the first to write with;
    ``"keyless"`` with ``--keyless``."""
    files = getattr(args, "key_file", None) or []
    if getattr(args, "keyless", False):
        if files:
            raise CliError("--keyless and --key-file: give one of them")
        return "keyless"
    if files:
        return [Key.from_file(f) for f in files]
    text = os.environ.get("CAS_KEY", "").strip()
    if not text:
        return None
    return [Key.from_text(t, "environment variable CAS_KEY") for t in text.split(",")
            if t.strip()]


def storage_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in args.storage_option:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise CliError(f"--storage-option {item!r} is not KEY=VALUE")
        try:
            options[key] = json.loads(raw)
        except ValueError:
            options[key] = raw
    client = dict(options.get("client_kwargs") or {})
    if args.endpoint_url:
        client["endpoint_url"] = args.endpoint_url
    if args.region:
        client["region_name"] = args.region
    if client:
        options["client_kwargs"] = client
    if args.profile:
        options["profile"] = args.profile
    return options


def _types(args: argparse.Namespace) -> Any:  # a TypeRegistry (open() takes one as types=)
    """The classes the command line builds (``--types langgraph``: LangGraph's and LangChain's;
    else none). An object of any other class, such as a stand-in CasSaver stored for a class it
    was not told about, is shown as ``Stored(name, data)``: its class name and its data; no
    class is ever imported by its name."""
    reg = TypeRegistry()
    if getattr(args, "types", None) == "langgraph":
        try:
            from cas_checkpoint.integrations.langgraph import default_types
        except ImportError as exc:
            raise CliError(f"--types langgraph needs LangGraph: pip install "
                           f"'cas_checkpoint[langgraph]' ({exc})") from None
        reg = default_types()
    reg.unknown = Stored
    return reg


def open_store(args: argparse.Namespace, url: str | None = None, *,
               create: bool = False) -> CheckpointStore:
    """The store named on the command line. Read commands pass ``create=False``: a URL that
    holds no store is an error, and nothing is created."""
    url = args.store if url is None else url
    return CheckpointStore.open(url, storage_options=storage_options(args), types=_types(args),
                                create=create, encryption=encryption(args),
                                timeout=getattr(args, "timeout", None),
                                retries=getattr(args, "retries", None))


# --- naming checkpoints ---

_HEX = re.compile(r"[0-9a-f]{4,64}")


def _history(store: CheckpointStore, thread: str) -> list[CheckpointInfo]:
    return store.history(thread)


def _by_prefix(infos: Iterable[CheckpointInfo], prefix: str, where: str) -> CheckpointInfo:
    found: dict[str, CheckpointInfo] = {}
    for info in infos:
        if info.id.startswith(prefix):
            found.setdefault(info.id, info)
    if not found:
        raise NotFoundError(f"no checkpoint id starts with {prefix!r} {where}; "
                            "`cas-checkpoint log STORE THREAD` lists them")
    if len(found) > 1:
        raise CliError(f"{prefix!r} names {plural(len(found), 'checkpoint')} {where} ("
                       + ", ".join(sorted(i[:16] for i in found)[:5])
                       + "); give more of the id")
    return next(iter(found.values()))


def resolve(store: CheckpointStore, spec: str, thread: str | None = None) -> CheckpointInfo:
    """A checkpoint named by ``spec``: with ``thread``, a (short) id or ``~N`` (N checkpoints
    back from the head) in that thread; alone, a thread's name (its head), ``THREAD~N``, or a
    (short, at least 4 hex digits) checkpoint id looked up in every thread."""
    if thread is not None:
        hist = _history(store, thread)
        if re.fullmatch(r"~\d+", spec):
            return _back(hist, int(spec[1:]), thread)
        if not _HEX.fullmatch(spec):
            raise CliError(f"{spec!r} is not a checkpoint id (hex) or ~N")
        return _by_prefix(hist, spec, f"in thread {thread!r}")
    threads = store.threads()
    if spec in threads:
        return _back(_history(store, spec), 0, spec)
    base, tilde, n = spec.rpartition("~")
    if tilde and n.isdigit() and base in threads:
        return _back(_history(store, base), int(n), base)
    if _HEX.fullmatch(spec):
        return _by_prefix((i for t in threads for i in _history(store, t)), spec,
                          "in any thread")
    raise NotFoundError(f"{spec!r} is neither a thread of this store nor a checkpoint id; "
                        "`cas-checkpoint threads STORE` lists the threads")


def _back(hist: list[CheckpointInfo], n: int, thread: str) -> CheckpointInfo:
    if n >= len(hist):
        raise NotFoundError(f"thread {thread!r} has {plural(len(hist), 'checkpoint')}; ~{n} "
                            "goes past its first")
    return hist[n]


# --- durations ---

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``1h``, ``7d``, ``2w`` (or combined: ``1h30m``)."""
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhdw])", text.strip().lower())
    if not parts or "".join(a + b for a, b in parts) != text.strip().lower():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration; write e.g. 30s, 15m, 1h, 7d or 1h30m")
    return timedelta(seconds=sum(float(a) * _UNITS[b] for a, b in parts))


def count(text: str) -> int:
    """A whole number, 0 or more (``--keep-last 0``)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative; give 0 or more")
    return n


def positive_int(text: str) -> int:
    """A whole number, 1 or more (``-n/--limit``)."""
    n = count(text)
    if n == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not 1 or more")
    return n


def seconds(text: str) -> float:
    """``--timeout``: a positive number of seconds (at most a day)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds; write e.g. --timeout 10") from None
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a positive number of seconds up to 86400; write e.g. --timeout 10")
    return value


def attempts(text: str) -> int:
    """``--retries``: a whole number of attempts from 1 to 100."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 100:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number from 1 to 100; write e.g. --retries 3")
    return value


# --- JSON ---

def jsonable(value: Any) -> Any:
    """A state or report as JSON values: bytes as ``{"$bytes": base64}``, tuples as lists,
    datetimes as ISO text, other types as their repr (never executed, only shown)."""
    stack: list[tuple[Any, Any, Any]] = []
    root: list[Any] = [None]
    stack.append((value, root, 0))
    while stack:  # iterative: a deep state must not exhaust the C stack
        v, parent, key = stack.pop()
        if v is None or isinstance(v, (bool, int, float, str)):
            out: Any = v
        elif isinstance(v, (bytes, bytearray, memoryview)):
            out = {"$bytes": base64.b64encode(bytes(v)).decode()}
        elif isinstance(v, dict):
            out = {}
            for k, item in v.items():
                name = k if isinstance(k, str) else json.dumps(jsonable(k), sort_keys=True)
                out[name] = None
                stack.append((item, out, name))
        elif isinstance(v, (list, tuple, set, frozenset)):
            seq = list(v) if not isinstance(v, (set, frozenset)) else sorted(v, key=repr)
            out = [None] * len(seq)
            stack.extend((item, out, i) for i, item in enumerate(seq))
        elif isinstance(v, datetime):
            out = v.isoformat()
        elif isinstance(v, CheckpointInfo):
            out = info_dict(v)
        elif type(v) is Stored:  # an object of a class the store was not given
            out = {"$class": v.name, "data": None}
            stack.append((v.data, out, "data"))
        else:
            out = repr(v)
        parent[key] = out
    return root[0]


def info_dict(info: CheckpointInfo) -> dict[str, Any]:
    out = {"id": info.id, "thread": info.thread_id, "step": info.step,
           "parents": list(info.parent_ids), "created_at": info.created_at.isoformat(),
           "size": info.size, "label": info.label, "tags": list(info.tags),
           "metadata": jsonable(info.metadata)}
    for extra in ("status", "kind", "reason"):
        if hasattr(info, extra):
            out[extra] = getattr(info, extra)
    return out


def emit_json(value: Any) -> None:
    json.dump(jsonable(value), sys.stdout, indent=2, sort_keys=False, ensure_ascii=False)
    sys.stdout.write("\n")


def check_thread_arg(thread: str) -> str:
    if not thread:
        raise InvalidArgumentError("the thread id is empty")
    return thread
