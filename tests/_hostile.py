"""Hostile stores for the tests (a thread whose only pack lies about one of its objects), and
the snapshot of a store's files that a refused operation must leave unchanged."""

from __future__ import annotations

import os

from cas_checkpoint import CheckpointStore
from cas_checkpoint.engine import staging
from cas_checkpoint.engine.object_store import pack_key
from cas_checkpoint.engine.refs import Ref, thread_key
from cas_checkpoint.format.heads import Head, PackRef
from cas_checkpoint.format.objects import ObjectId, object_id


def plant_lying_pack(store: CheckpointStore, thread: str, ref: Ref,
                     objects: dict[str, bytes], target: str, liar: bytes) -> PackRef:
    """Make ``thread``'s head (``ref``) name one pack holding ``objects``, where the pack's
    index names ``target`` (by its id) at the bytes ``liar``. The pack itself is intact: it
    hashes to its name. Returns the pack."""
    lying = dict(objects)
    lying[target] = liar
    pref, data = staging.make_pack({ObjectId(k): v for k, v in lying.items()}, 0)
    assert pref.id == object_id(data)  # the pack itself is intact
    store.backend.put_many({pack_key(pref.id): data})
    h = ref.head
    hostile = Head(h.thread_id, h.head, h.head_step, h.peaks, h.tail, (pref,), (), h.lineage)
    store.backend.write_ref(thread_key(thread), hostile.encode(), ref.version)
    return pref


def files(root: str | os.PathLike[str]) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes (what a refused save must leave unchanged)."""
    out = {}
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out
