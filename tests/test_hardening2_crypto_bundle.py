"""Issue 27, items 9 and 10: a flipped bit in the clear key id of an encrypted pack or ref is
damage (IntegrityError, a verify problem), not a missing key; a genuinely missing key is still
an InvalidArgumentError. Hostile bundles are refused before their records grow the importer
(in a subprocess with an address-space cap)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from cas_checkpoint import CheckpointStore, IntegrityError, InvalidArgumentError, Key
from cas_checkpoint.crypto import DamagedKeyId, Keyring, open_sealed_pack, seal_head, seal_pack
from cas_checkpoint.refs import thread_key

ROOT = Path(__file__).resolve().parent.parent
KID_REF, KID_PACK = 5, 6  # where the 8-byte clear key id starts in a sealed ref / pack


def _grow(store: CheckpointStore, thread: str, n: int = 3) -> None:
    for i in range(n):
        store.save(thread, {"messages": [f"message {j} of {thread} " * 200 for j in range(i + 1)]})


def _flip(backend: Any, key: str, pos: int) -> None:
    """Flip one bit of a stored ref or pack, past the encryption (as storage damage would)."""
    if key.startswith("packs"):
        data = bytearray(backend.get(key))
        data[pos] ^= 0x10
        backend.delete_many([key])
        backend.put_many({key: bytes(data)})
    else:
        got = backend.read_ref(key)
        data = bytearray(got[0])
        data[pos] ^= 0x10
        backend.write_ref(key, bytes(data), got[1])


def _refs(store: CheckpointStore) -> list[str]:
    return sorted(i.key for i in store.backend.inner.list("refs/heads")
                  if not i.key.endswith(".lock"))


def _thread_ref(url: str, key: Key, thread: str) -> str:
    store = CheckpointStore.open(url, encryption=key)
    return store.backend.ref_key(thread_key(thread))  # type: ignore[attr-defined]


@pytest.mark.parametrize("where", ["memory", "local"])
def test_a_flipped_key_id_in_a_ref_is_damage_and_verify_carries_on(tmp_path: Path,
                                                                   where: str) -> None:
    url = f"memory://h2-{uuid.uuid4().hex[:8]}" if where == "memory" else str(tmp_path / "s")
    key = Key.generate()
    store = CheckpointStore.open(url, encryption=key)
    _grow(store, "a")
    _grow(store, "b")
    _flip(store.backend.inner, _thread_ref(url, key, "a"), KID_REF)  # type: ignore[attr-defined]
    fresh = CheckpointStore.open(url, encryption=key)
    with pytest.raises(IntegrityError) as got:
        fresh.load("a")
    assert not isinstance(got.value, InvalidArgumentError)
    assert "damaged" in str(got.value) and "verify" in str(got.value)
    assert fresh.load("b").state["messages"]  # the other thread is untouched
    report = fresh.verify(deep=True)
    assert [(p.kind, p.what) for p in report.problems] == [("corrupt", "ref")]
    assert "key id" in report.problems[0].detail
    assert report.threads == 2 and report.checkpoints == 3  # thread b was audited


def test_a_flipped_key_id_in_a_pack_is_damage_and_verify_carries_on(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    key = Key.generate()
    store = CheckpointStore.open(url, encryption=key)
    _grow(store, "a")
    pack = sorted(i.key for i in store.backend.inner.list("packs"))[0]  # type: ignore[attr-defined]
    _flip(store.backend.inner, pack, KID_PACK)  # type: ignore[attr-defined]
    fresh = CheckpointStore.open(url, encryption=key)
    with pytest.raises(IntegrityError):
        fresh.load("a")
    report = fresh.verify(deep=True)  # raised InvalidArgumentError ("not among the keys given")
    assert ("corrupt", "pack") in [(p.kind, p.what) for p in report.problems]


def test_open_sealed_pack_tells_a_damaged_id_from_a_missing_key() -> None:
    key, other = Key.generate(), Key.generate()
    plain = b"CASP\x03" + b"x" * 100
    sealed = bytearray(seal_pack(plain, key))
    sealed[KID_PACK + 3] ^= 0x01
    with pytest.raises(DamagedKeyId, match="verify"):  # the key given opens it: a damaged id
        open_sealed_pack(bytes(sealed), Keyring([key]), "packs/ab/cd")
    with pytest.raises(InvalidArgumentError, match="rekey"):  # a key we were not given
        open_sealed_pack(seal_pack(plain, other), Keyring([key]), "p")
    by_other = bytearray(seal_pack(plain, other))
    by_other[KID_PACK] ^= 0x80
    ring = Keyring([key])
    ring.recorded.add(other.id)  # a key the store uses, not given; its id one bit off: damage
    with pytest.raises(DamagedKeyId):
        open_sealed_pack(bytes(by_other), ring, "p")


def test_a_missing_key_is_still_an_invalid_argument(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    old, new = Key.generate(), Key.generate()
    _grow(CheckpointStore.open(url, encryption=old), "a")  # sealed under the creating key
    _grow(CheckpointStore.open(url, encryption=[new, old]), "b")
    only_new = CheckpointStore.open(url, encryption=new)
    assert only_new.load("b").state["messages"]
    with pytest.raises(InvalidArgumentError, match="not among the keys given") as got:
        only_new.load("a")
    assert "rekey" in str(got.value)
    assert not isinstance(got.value, IntegrityError)
    # the creating key's id (recorded in the store), flipped in thread a's ref: damage, even
    # though that key was not given
    _flip(only_new.backend.inner, _thread_ref(url, old, "a"), KID_REF)  # type: ignore[attr-defined]
    with pytest.raises(DamagedKeyId):
        CheckpointStore.open(url, encryption=new).load("a")


def test_a_ref_sealed_by_a_key_the_store_never_knew_is_a_missing_key() -> None:
    url = f"memory://h2-{uuid.uuid4().hex[:8]}"
    key, stranger = Key.generate(), Key.generate()
    store = CheckpointStore.open(url, encryption=key)
    _grow(store, "a")
    ref = _thread_ref(url, key, "a")
    inner = store.backend.inner  # type: ignore[attr-defined]
    got = inner.read_ref(ref)
    plain = store.backend.read_ref(thread_key("a"))  # the plain head, via the sealing wrapper
    assert got is not None and plain is not None
    inner.write_ref(ref, seal_head(plain[0], stranger, ref), got[1])
    with pytest.raises(InvalidArgumentError, match="not among the keys given"):
        CheckpointStore.open(url, encryption=key).load("a")
