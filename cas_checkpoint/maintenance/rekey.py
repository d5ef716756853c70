"""Key rotation: ``rekey`` rewrites every thread's packs and head under the writing key (by
compare-and-swap, safe while others write), then retires the other keys' ``keys/`` files."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cas_checkpoint.backends.sealed import SealedBackend
from cas_checkpoint.engine.encryption import record_writer
from cas_checkpoint.engine.steps import List, Step
from cas_checkpoint.format.heads import Head, PackRef
from cas_checkpoint.format.sealing import KEYS, key_file

if TYPE_CHECKING:
    from cas_checkpoint.engine.refs import RefStore


def rekey(refs: RefStore, backend: SealedBackend) -> Step[dict[str, Any]]:
    """Every thread's packs and head rewritten under the writing key (by compare-and-swap:
    safe while others write); then the key files of other keys are removed. Returns a report:
    threads and packs rewritten, the key ids retired."""
    from cas_checkpoint.engine.refs import Ref
    from cas_checkpoint.engine.staging import make_pack
    from cas_checkpoint.format.objects import ObjectId as Oid

    writer = backend.ring.write_key()
    objects = refs.objects
    yield from objects.settle()
    if objects.settings is not None:
        yield from record_writer(backend.ring, objects.settings, backend.names)
    threads = yield from refs.threads()
    report: dict[str, Any] = {"threads": 0, "packs_rewritten": 0, "bytes_written": 0,
                              "key_id": writer.id, "retired_key_ids": []}
    renamed: dict[str, PackRef] = {}  # old pack id -> its rewrite
    for thread in threads:
        def change(ref: Ref | None) -> Step[tuple[Head | None, dict[Oid, bytes]]]:
            if ref is None:
                return None, {}
            head = ref.head
            got = yield from objects.packs([p.id for p in head.packs])
            old = [p for p in head.packs if objects.sealed_by.get(p.id) != writer.id]
            new: dict[Oid, bytes] = {}
            for p in old:
                if p.id in renamed:  # shared with a thread rewritten before (a fork)
                    continue
                made, data = make_pack(got[p.id].objects, p.level, objects.compressor,
                                       objects.sealer())
                new[made.id] = data
                renamed[p.id] = made
            if new:
                yield from objects.put_packs(new)
            report["packs_rewritten"] += len(new)
            report["bytes_written"] += sum(map(len, new.values()))
            packs = tuple(renamed.get(p.id, p) for p in head.packs)
            return Head(head.thread_id, head.head, head.head_step, head.peaks, head.tail,
                        packs, head.inline, head.lineage, head.archive, head.held), {}

        if (yield from refs.update(thread, change)) is not None:
            report["threads"] += 1
    listed = yield List(KEYS)
    stale = [i.key for i in listed if i.key != key_file(writer.id)]
    if stale:
        from cas_checkpoint.engine.steps import DeleteMany

        yield DeleteMany(stale)
    report["retired_key_ids"] = [k.rsplit("/", 1)[-1] for k in stale]
    return report


__all__ = ["rekey"]
