"""A worker process for the soak tests (run as a script): saves, loads or hangs as told by the
JSON config in argv[1], and reports on stdout, one flushed line per event, e.g. ``ok THREAD ID
DIGEST`` once save() has returned."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _soak import check_state, make_state  # noqa: E402

from cas_checkpoint import CasError, CheckpointStore, ConflictError, NotFoundError  # noqa: E402


def out(*parts: object) -> None:
    sys.stdout.write(" ".join(map(str, parts)) + "\n")  # one write: a kill cuts at most the end
    sys.stdout.flush()


def writer(store: CheckpointStore, cfg: dict[str, Any]) -> None:
    w, threads, n = cfg["writer"], cfg["threads"], cfg.get("n")
    i = 0
    while n is None or i < n:
        thread = threads[i % len(threads)]
        state = make_state(w, i, cfg.get("pad", 0))
        out("attempt", thread, state["sum"])
        meta = {"w": w, "i": i}
        try:
            if cfg.get("expected"):
                head = cfg["first_head"] if i == 0 else store.head(thread)
                while True:
                    try:
                        info = store.save(thread, state, metadata=meta, expected_head=head)
                        break
                    except ConflictError as exc:
                        out("conflict", thread)
                        head = exc.actual
            else:
                info = store.save(thread, state, metadata=meta)
            out("ok", thread, info.id, state["sum"])
        except CasError as exc:
            out("error", thread, type(exc).__name__, " ".join(str(exc).split())[:400])
        i += 1
    out("done")


def reader(store: CheckpointStore, cfg: dict[str, Any]) -> None:
    seen: set[str] = set()
    loads = 0
    while not os.path.exists(cfg["stop_file"]):
        try:
            cp = store.load(cfg["thread"])
        except NotFoundError:
            time.sleep(0.001)
            continue
        loads += 1
        got = check_state(cp.state)
        if got not in seen:
            seen.add(got)
            out("saw", got)
    out("done", loads)


def hang_in_ref(store: CheckpointStore, cfg: dict[str, Any]) -> None:
    """Save, but stop for good inside the ref update (holding its lock) until killed."""
    import cas_checkpoint.backends.local as backend

    real = os.replace

    def replace(src: str, dst: str) -> None:
        if f"{os.sep}refs{os.sep}" in dst:
            out("locked")
            time.sleep(3600)
        real(src, dst)

    def write_slot(*_: Any) -> None:  # a steady update writes into the ref's free slot
        out("locked")
        time.sleep(3600)

    backend.os.replace = replace  # type: ignore[assignment]
    backend.LocalBackend._write_slot = staticmethod(write_slot)  # type: ignore[method-assign]
    store.save(cfg["thread"], make_state(99, 0))
    out("done")


def trace_merges() -> set[str]:
    """Print ``merge`` when a save has staged a merge (before its packs and ref are written),
    so a test can tell a kill that landed in the middle of a merge; returns the merged pack ids
    staged so far (filled as saves go)."""
    from cas_checkpoint.engine import staging

    merged: set[str] = set()
    real = staging.stage

    def stage(head: Any, new: Any, read: Any, inline_max: int = staging.INLINE_MAX,
              compressor: Any = None, **options: Any) -> Any:
        staged, written = real(head, new, read, inline_max, compressor, **options)
        ids = {p.id for p in staged.packs if p.level > 0 and p.id in written}
        if ids:
            merged.update(ids)
            out("merge", len(ids))
        return staged, written

    staging.stage = stage  # type: ignore[assignment]
    return merged


def hang_in_merge(store: CheckpointStore, cfg: dict[str, Any]) -> None:
    """Save in a loop (``inline_max`` tiny: merges come fast) and stop for good inside the
    first save that merges packs, at ``cfg["at"]``: ``before_pack`` (nothing of it written),
    ``in_pack`` (local disk: the merged pack's temp file written and fsynced, not linked) or
    ``before_ref`` (the merged pack written, the ref not yet), until killed."""
    import cas_checkpoint.backends.local as backend
    from cas_checkpoint.engine.object_store import key_pack_id

    at = cfg["at"]
    merged = trace_merges()

    def hang(what: str) -> None:
        out("hung", what)
        time.sleep(3600)

    real_put = store.backend.put_many

    def put_many(items: dict[str, bytes]) -> None:
        hit = [k for k in items if key_pack_id(k) in merged]
        if hit and at == "before_pack":
            hang(hit[0])
        real_put(items)
        if hit and at == "before_ref":
            hang(hit[0])

    store.backend.put_many = put_many  # type: ignore[method-assign]
    if at == "in_pack":
        real_link = os.link

        def link(src: str, dst: str, **kw: Any) -> None:
            if any(dst.endswith(os.sep + p[2:]) for p in merged):
                hang(dst)
            real_link(src, dst, **kw)

        backend.os.link = link  # type: ignore[assignment]
    thread = cfg["thread"]
    for i in range(10_000):
        state = make_state(cfg["writer"], i, cfg.get("pad", 0))
        info = store.save(thread, state, metadata={"w": cfg["writer"], "i": i})
        out("ok", thread, info.id, state["sum"])
    out("done")


def async_writer(cfg: dict[str, Any]) -> None:
    """``tasks`` asyncio tasks on one AsyncCheckpointStore, saving in a loop to ``threads``."""
    import asyncio

    from cas_checkpoint.aio import AsyncCheckpointStore

    async def main() -> None:
        store = await AsyncCheckpointStore.open(cfg["url"],
                                                storage_options=cfg.get("storage_options"))
        if cfg.get("inline_max") is not None:
            store._core.refs.inline_max = cfg["inline_max"]
        out("ready")

        async def task(t: int) -> None:
            threads = cfg["threads"]
            for i in range(cfg.get("n") or 10**9):
                thread = threads[(t + i) % len(threads)]
                state = make_state(cfg["writer"] * 1000 + t, i, cfg.get("pad", 0))
                info = await store.save(thread, state, metadata={"t": t, "i": i})
                out("ok", thread, info.id, state["sum"])

        await asyncio.gather(*(task(t) for t in range(cfg["tasks"])))
        out("done")

    asyncio.run(main())


def main() -> None:
    cfg = json.loads(sys.argv[1])
    if cfg["role"] == "async_writer":
        return async_writer(cfg)
    store = CheckpointStore.open(cfg["url"], storage_options=cfg.get("storage_options"),
                                 allow_unsafe=cfg.get("allow_unsafe", False))
    if cfg.get("inline_max") is not None:  # tiny: a pack every save, merges all the time
        store.refs.inline_max = cfg["inline_max"]
    if cfg.get("trace_merges"):
        trace_merges()
    out("ready")
    {"writer": writer, "reader": reader, "hang_in_ref": hang_in_ref,
     "hang_in_merge": hang_in_merge}[cfg["role"]](store, cfg)


if __name__ == "__main__":
    main()
