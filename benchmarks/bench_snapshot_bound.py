"""A newest state kept whole: the read it would give a never-read thread, and what keeping it
would cost each save.

issue 29 asks a thread no store object of the process has read for at most 1.5x SqliteSaver's
``get_tuple``. ``bench_read_bound.py`` served the newest state from one blob but kept the rest
of the read (the log's newest entries, the record's fields). A design keeping the newest state
whole would let the head name it, with what the tuple needs (metadata, parent, pending writes),
so a read is: the ref, the head (the real code), one object fetched, hashed with BLAKE3,
decompressed and decoded by the codec, the ``CheckpointTuple`` built. This benchmark measures
that read, each mode in a fresh process reading ``--threads`` threads of each ``--steps`` once
(every message its own), CPU medians of the calling thread:

* **CasSaver, never read**: the real ``get_tuple``;
* **head + object in a pack**: the snapshot is its own file (a pack of one object the head
  would name): read, hashed, decompressed, decoded;
* **head + inline object**: the snapshot rides in the head (read with it: its bytes are held
  in memory beforehand, untimed; they are hashed, decompressed and decoded in the read);
* **SqliteSaver**: ``get_tuple`` on an open connection.

The write side (``--write-steps``, one process a size, CasSaver on a local folder): a tool loop
written by CasSaver with its backend's writes counted per call, SqliteSaver's stored bytes per
put in the same process, and the work a whole state adds to a put (zstd of its encoding, which
``PutEncoder`` has already built, and BLAKE3 of the blob), beside a CasSaver put's and an
InMemorySaver put's CPU.

    python benchmarks/bench_snapshot_bound.py [--threads 120] [--steps 25,50] [--rounds 2]
        [--write-steps 9,49,199]

``--steps 25`` gives 52 messages a thread, ``50`` 102; ``--write-steps 9,49,199`` 20, 100
and 400.
"""

from __future__ import annotations

import gc
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import table  # noqa: E402

READS = ("cas", "pack", "inline", "every", "head", "sqlite")
TAIL = 3  # a whole state every 4 saves: at most 3 newer messages beside it
LABELS = {"cas": "CasSaver, never read", "pack": "head + object in a pack",
          "inline": "head + inline object",
          "every": f"every {TAIL + 1} saves: object + {TAIL} inline messages",
          "head": "the ref and head alone", "sqlite": "SqliteSaver"}


def snapshots(where: str, threads: int) -> dict[str, float]:
    """Each thread's newest tuple (from a real ``get_tuple``) encoded by the codec as one
    object, in zstd (level 3, the packs' level), one file a thread, and an index."""
    import msgpack
    import zstandard
    from bench_read_bound import _cas, _config
    from blake3 import blake3

    from cas_checkpoint.format import codec
    from cas_checkpoint.integrations.langgraph.keys import _key

    saver = _cas(where)
    types = saver._core.types
    folder = os.path.join(where, "snap")
    os.makedirs(folder, exist_ok=True)
    compressor = zstandard.ZstdCompressor(level=3)
    index: dict[str, list[Any]] = {}
    sizes = []
    for k in range(threads):
        t = saver.get_tuple(_config(k))
        parent = (t.parent_config or {}).get("configurable", {}).get("checkpoint_id")
        whole = {"lg": t.config["configurable"]["checkpoint_id"], "c": t.checkpoint,
                 "m": dict(t.metadata), "p": parent,
                 "w": [list(w) for w in t.pending_writes or ()]}
        data = codec.encode(whole, types=types)
        blob = compressor.compress(data)
        name = _key(f"c{k}", "")
        head = saver._run(saver._core.ref(name)).head
        path = os.path.join(folder, f"{k}.zst")
        Path(path).write_bytes(blob)
        # every K saves: the whole state K - 1 messages back, the newer ones inline objects
        messages = t.checkpoint["channel_values"]["messages"]
        older = dict(whole, c=dict(t.checkpoint, channel_values=dict(
            t.checkpoint["channel_values"], messages=messages[:-TAIL])))
        Path(path + ".old").write_bytes(compressor.compress(codec.encode(older, types=types)))
        Path(path + ".tail").write_bytes(msgpack.packb(
            [codec.encode(m, types=types) for m in messages[-TAIL:]]))
        index[name] = [path, blake3(blob).hexdigest(), head.head]
        sizes.append((len(data), len(blob)))
    Path(folder, "index.json").write_text(json.dumps(index))
    return {"encoded": statistics.median(a for a, _ in sizes),
            "zstd": statistics.median(b for _, b in sizes)}


def read(kind: str, where: str, threads: int) -> dict[str, Any]:
    """Every thread's newest tuple once, in this fresh process; CPU a read."""
    from bench_read_bound import _cas, _config, _sqlite

    if kind == "sqlite":
        saver = _sqlite(where)
        get = saver.get_tuple
    else:
        saver = _cas(where)
        get = saver.get_tuple if kind == "cas" else _snapshot_reader(saver, where, kind)
    get(_config(0))
    gc.collect()
    cpu = []
    for k in range(1, threads):
        start = time.thread_time()
        got = get(_config(k))
        cpu.append(time.thread_time() - start)
        assert got is not None
    return {"cpu": statistics.median(cpu), "messages": len(
        got.checkpoint["channel_values"]["messages"]) if kind != "head" else 0}


def _snapshot_reader(saver: Any, where: str, kind: str) -> Any:
    """``get_tuple`` of a design whose head names its newest state kept whole."""
    import msgpack
    import zstandard
    from blake3 import blake3
    from langgraph.checkpoint.base import CheckpointTuple

    from cas_checkpoint.format import codec
    from cas_checkpoint.integrations.langgraph.keys import _config as lg_config
    from cas_checkpoint.integrations.langgraph.keys import _key, _target

    core, types = saver._core, saver._core.types
    index = json.loads(Path(where, "snap", "index.json").read_text())
    inline = ({name: Path(p).read_bytes() for name, (p, _, _) in index.items()}
              if kind == "inline" else {})
    tails = ({name: msgpack.unpackb(Path(p + ".tail").read_bytes())
              for name, (p, _, _) in index.items()} if kind == "every" else {})
    decompressor = zstandard.ZstdDecompressor()

    def get(config: Any) -> Any:
        thread_id, ns = _target(config)
        name = _key(thread_id, ns)
        head = saver._run(core.ref(name)).head  # the ref read and the head decoded
        path, digest, cid = index[name]
        if head.head != cid:
            raise RuntimeError(f"{name}: the head moved since the snapshot")
        if kind == "head":
            return head
        if kind == "inline":
            blob = inline[name]
        else:
            with open(path + ".old" if kind == "every" else path, "rb") as f:
                blob = f.read()
        checked = blake3(blob).hexdigest()  # (every: the older object's, the same work)
        if kind != "every" and checked != digest:
            raise RuntimeError(f"snapshot of {name} damaged")
        whole = codec.decode(decompressor.decompress(blob), types=types)
        if kind == "every":
            messages = whole["c"]["channel_values"]["messages"]
            for obj in tails[name]:
                blake3(obj).digest()  # an inline object's id checked
                messages.append(codec.decode(obj, types=types))
        parent = whole["p"]
        return CheckpointTuple(lg_config(thread_id, ns, whole["lg"]), whole["c"], whole["m"],
                               lg_config(thread_id, ns, parent) if parent else None,
                               [tuple(w) for w in whole["w"]])

    return get


def write_cost(steps: int) -> dict[str, Any]:
    """One tool loop of ``steps`` written by CasSaver on a local folder (its writes counted
    per call), SqliteSaver and InMemorySaver (put CPU); what a whole state adds to a put."""
    import zstandard
    from bench_langgraph import build_graph, text
    from blake3 import blake3
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.sqlite import SqliteSaver

    from cas_checkpoint.format import codec
    from cas_checkpoint.integrations.langgraph import CasSaver

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as where:
        cas = CasSaver.from_url(os.path.join(where, "cas"))
        sq = SqliteSaver(sqlite3.connect(os.path.join(where, "lg.sqlite"),
                                         check_same_thread=False))
        mem = InMemorySaver()
        backend = cas._core.backend
        count = {"bytes": 0, "objects": 0, "refs": 0}
        put_many, write_ref = backend.put_many, backend.write_ref

        def counted_put(items: dict[str, bytes]) -> None:
            count["bytes"] += sum(map(len, items.values()))
            count["objects"] += len(items)
            put_many(items)

        def counted_ref(key: str, data: bytes, expected: str | None, refresh: Any = None
                        ) -> str:
            count["bytes"] += len(data)
            count["refs"] += 1
            return write_ref(key, data, expected, refresh)

        backend.put_many = counted_put  # type: ignore[method-assign]
        backend.write_ref = counted_ref  # type: ignore[method-assign]
        calls: dict[str, list[dict[str, float]]] = {"put": [], "put_writes": []}
        cpu: dict[str, list[float]] = {"cas": [], "sqlite": [], "memory": []}

        def wrap(saver: Any, label: str) -> None:
            for method in ("put", "put_writes"):
                real = getattr(saver, method)

                def call(*args: Any, _real: Any = real, _m: str = method, **kw: Any) -> Any:
                    before = dict(count)
                    start = time.thread_time()
                    got = _real(*args, **kw)
                    spent = time.thread_time() - start
                    if _m == "put":
                        cpu[label].append(spent)
                    if label == "cas":
                        calls[_m].append({k: count[k] - before[k] for k in count})
                    return got

                setattr(saver, method, call)

        for saver, label in ((cas, "cas"), (sq, "sqlite"), (mem, "memory")):
            wrap(saver, label)
            first = HumanMessage(content="t " + text(-1), id="t human-0")
            build_graph(steps, saver, tag="t ").invoke(
                {"messages": [first]},
                {"configurable": {"thread_id": "t"}, "recursion_limit": 2 * steps + 20})
        newest = cas.get_tuple({"configurable": {"thread_id": "t"}})
        assert newest is not None
        state = newest.checkpoint
        messages = len(state["channel_values"]["messages"])
        data = codec.encode(state, types=cas._core.types)
        msgs = codec.encode(state["channel_values"]["messages"], types=cas._core.types)
        compressor = zstandard.ZstdCompressor(level=3)
        extra = []
        for _ in range(21):
            start = time.thread_time()
            blob = compressor.compress(data)
            blake3(blob).digest()
            extra.append(time.thread_time() - start)
        con = sqlite3.connect(os.path.join(where, "lg.sqlite"))
        sq_rows = con.execute(
            "SELECT length(checkpoint) + length(metadata) FROM checkpoints "
            "ORDER BY checkpoint_id DESC LIMIT 5").fetchall()
        sq_writes = con.execute("SELECT count(*), sum(length(value)) FROM writes").fetchone()
        sq_puts = con.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
    last = 5  # the newest calls: the thread at its length
    out.update(
        messages=messages, encoded=len(data), messages_encoded=len(msgs), zstd=len(blob),
        extra_us=statistics.median(extra) * 1e6,
        put_us={k: statistics.median(v[-last:]) * 1e6 for k, v in cpu.items()},
        puts=len(calls["put"]), put_writes=len(calls["put_writes"]),
        cas_put={k: statistics.mean(c[k] for c in calls["put"][-last:]) for k in count},
        cas_pw={k: statistics.mean(c[k] for c in calls["put_writes"][-last:])
                for k in count},
        cas_all={k: sum(c[k] for cs in calls.values() for c in cs) for k in count},
        sq_put=statistics.mean(r[0] for r in sq_rows), sq_puts=sq_puts,
        sq_writes=list(sq_writes))
    return out


def _written(where: str, threads: int, steps: int) -> Any:
    from bench_read_bound import write

    write(where, threads, steps)
    return snapshots(where, threads)


def child(args: list[str]) -> None:
    from bench_read_bound import serve

    serve(args, {"write": _written, "cost": lambda _, __, steps: write_cost(steps)}, read)


def _run(mode: str, where: str, threads: int, steps: int) -> Any:
    from bench_read_bound import run_child

    return run_child(__file__, mode, where, threads, steps)


def _kb(n: float) -> str:
    return f"{n / 1024:.1f} KB"


def main() -> None:
    from bench_read_bound import parsed, parser, rounds_of

    ap = parser(__doc__ or "", 120)
    ap.add_argument("--write-steps", default="9,49,199")
    ns = parsed(ap, child)
    if ns is None:
        return
    try:
        steps = [int(s) for s in ns.steps.split(",") if s]
        wsteps = [int(s) for s in ns.write_steps.split(",") if s]
    except ValueError:
        ap.error("--steps and --write-steps take comma-separated step counts")
    print(f"load average {os.getloadavg()[0]:.1f}; {ns.threads} threads a size, "
          f"{ns.rounds} rounds; CPU medians of the calling thread, ms a read")
    rows = []
    for n in steps:
        size, got = rounds_of(__file__, READS, ns.threads, n, ns.rounds)
        sq = statistics.median(r["cpu"] for r in got["sqlite"])
        msgs = got["cas"][0]["messages"]
        for mode in READS:
            each = sorted(r["cpu"] for r in got[mode])
            cpu = statistics.median(each)
            rows.append([msgs, LABELS[mode], f"{cpu * 1000:.3f}", f"{cpu / sq:.2f}x",
                         f"{each[0] * 1000:.3f}-{each[-1] * 1000:.3f}"])
        rows.append([msgs, "the whole tuple, encoded / zstd",
                     f"{_kb(size['encoded'])} / {_kb(size['zstd'])}", "", ""])
    if rows:
        print(table(["messages", "read", "ms CPU", "x SqliteSaver", "rounds' range"], rows))
    wrows = []
    for n in wsteps:
        c = _run("cost", "-", 0, n)
        p, w = c["cas_put"], c["cas_pw"]
        wrows.append([
            c["messages"], f"{_kb(c['encoded'])} ({c['messages_encoded'] / c['encoded']:.0%})",
            _kb(c["zstd"]), f"{c['extra_us']:.0f}",
            f"{c['put_us']['cas']:.0f} / {c['put_us']['memory']:.0f} / "
            f"{c['put_us']['sqlite']:.0f}",
            f"{_kb(p['bytes'])} / {_kb(w['bytes'])}",
            f"{p['objects'] + p['refs']:.1f} / {w['objects'] + w['refs']:.1f}",
            _kb(c["sq_put"]), f"{c['puts']} / {c['put_writes']}"])
    if wrows:
        print()
        print("the write side (the newest 5 calls of one loop; bytes and objects+refs written "
              "a call):")
        print(table(["messages", "state encoded (messages)", "zstd", "zstd+hash us",
                     "put us CPU: cas / memory / sqlite", "cas bytes: put / put_writes",
                     "cas writes: put / put_writes", "sqlite bytes a put",
                     "calls: put / put_writes"], wrows))


if __name__ == "__main__":
    main()
