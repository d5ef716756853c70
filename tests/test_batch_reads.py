"""Cold loads read a level of nodes a batch at a time (each pack looks up and hashes the objects
it holds in one pass): every object is still checked against its full id before it is used,
and one that is not what its id says is refused, every time it is asked for."""

from __future__ import annotations

from typing import Any

import pytest
from _hostile import plant_lying_pack

from cas_checkpoint import CheckpointStore, FormatError, IntegrityError
from cas_checkpoint.format.objects import (
    NODE,
    decode_node,
    decode_nodes,
    encode_node,
    object_id,
    object_ids,
    object_kind,
)
from cas_checkpoint.format.placeholders import varint
from cas_checkpoint.tree.shapes import COUNTED, LIST, concat_lengths


def _state(n: int) -> dict[str, Any]:
    return {"step": n, "messages": [{"id": i, "text": f"message {i} " * 30} for i in range(n)]}


def _leaves(objects: dict[str, bytes]) -> list[str]:
    return sorted(o for o, d in objects.items() if object_kind(d) == NODE and d[5] == 0)


def _hostile(tmp_path: Any) -> tuple[CheckpointStore, str, bytes]:
    """A store whose thread's one pack hashes to its name but names a leaf of the state (by its
    id) at another leaf's bytes."""
    store = CheckpointStore.open(str(tmp_path / "s"))
    store.save("t", _state(120))
    ref = store.refs.read("t")
    assert ref is not None
    view = store.objects.view(ref.head)
    objects = {oid: view.get(oid) for oid in sorted(view.ids())}
    leaves = _leaves(objects)
    assert len(leaves) > 50  # a level of many nodes (71: one 16 KB region, small ones): one batch
    target, liar = leaves[len(leaves) // 2], objects[leaves[0]]
    plant_lying_pack(store, "t", ref, objects, target, liar)
    return store, target, liar


def test_a_leaf_named_at_another_leafs_bytes_is_refused_every_time(tmp_path: Any) -> None:
    store, target, liar = _hostile(tmp_path)
    fresh = CheckpointStore.open(store.url)
    for _ in range(2):  # the lie is never remembered as checked
        with pytest.raises(IntegrityError) as err:
            fresh.load("t")
        assert (err.value.expected, err.value.actual) == (target, object_id(liar))
    ref = fresh.refs.read("t")
    assert ref is not None
    view = fresh.objects.view(ref.head)
    [pack] = view.packs
    assert target not in pack.verified
    others = [o for o in _leaves({o: view.get(o) for o in view.ids() if o != target})]
    with pytest.raises(IntegrityError):
        view.get_views([*others, target])  # one batch: the others hashed right, not target
    assert target not in pack.verified and pack.verified.issuperset(others)
    out: dict[str, bytes | memoryview] = {}
    assert pack.take_views([target, *others[:3]], out) == [target]
    assert target not in out and len(out) == 3


def test_a_batch_gives_what_reads_one_by_one_give(tmp_path: Any) -> None:
    store = CheckpointStore.open(str(tmp_path / "s"))
    for n in (40, 80, 120):
        store.save("t", _state(n))
    fresh = CheckpointStore.open(store.url)
    ref = fresh.refs.read("t")
    assert ref is not None
    view = fresh.objects.view(ref.head)
    ids = sorted(view.ids())
    got = view.get_views(ids + ids[:5])  # (a repeated id is read once)
    assert sorted(got) == ids
    assert all(object_id(bytes(got[o])) == o for o in ids)
    assert {o: bytes(v) for o, v in got.items()} == {o: view.get(o) for o in ids}
    assert fresh.load("t").state == _state(120)


def test_object_ids_is_object_id_of_each() -> None:
    datas: list[bytes | memoryview] = [b"", b"x", bytes(range(256)) * 5,
                                       memoryview(b"abc" * 500)[7:900]]
    assert object_ids(datas) == [object_id(d) for d in datas]
    assert object_ids([]) == []


def test_node_headers_with_many_children_and_long_lengths() -> None:
    kids = tuple(object_id(bytes([i])) for i in range(130))  # a count of two varint bytes
    node = encode_node(b"\x00\xc0", kids)
    assert decode_node(node) == (kids, memoryview(b"\x00\xc0"))
    leaf = encode_node(b"\x00\x91\x01")
    assert decode_nodes([memoryview(node), memoryview(leaf), leaf]) == [
        (kids, memoryview(b"\x00\xc0")), ((), memoryview(b"\x00\x91\x01")),
        ((), memoryview(b"\x00\x91\x01"))]
    counted = bytes([LIST | COUNTED]) + varint(1) + varint(200) + varint(3)
    assert concat_lengths("n", counted, 3) == (LIST, (1, 200, 3))
    assert concat_lengths("n", bytes([LIST | COUNTED, 1, 2, 127]), 3) == (LIST, (1, 2, 127))
    for bad, count in ((bytes([LIST | COUNTED, 1, 2]), 3),  # one length short
                       (bytes([LIST | COUNTED, 1, 2, 3, 4]), 3),  # one too many
                       (bytes([LIST | COUNTED, 0x81, 0x00, 1]), 2),  # not minimal
                       (bytes([LIST | COUNTED, 0x81, 0x00, 1]), 3)):
        with pytest.raises(FormatError):
            concat_lengths("n", bad, count)
