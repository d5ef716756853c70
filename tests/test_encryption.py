"""Client-side encryption: round trips on every backend (with and without compression), sharing
unchanged, nothing readable in stored bytes or paths, tampering refused, wrong / missing / old
keys, rotation and rekey (also while another process saves), gc and a quick verify without the
key, the command line's CAS_KEY and --key-file."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from builders import msg, run_cli_proc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cas_checkpoint import (
    CasError,
    CheckpointStore,
    FormatError,
    IntegrityError,
    InvalidArgumentError,
    Key,
    NotFoundError,
    copy_threads,
)
from cas_checkpoint.aio import AsyncCheckpointStore
from cas_checkpoint.engine.object_store import key_pack_id, parse_pack
from cas_checkpoint.engine.refs import thread_key
from cas_checkpoint.engine.settings import MARKER
from cas_checkpoint.format.heads import Head
from cas_checkpoint.format.objects import NODE, object_id, object_kind
from cas_checkpoint.format.pack import ENCRYPTED, ZSTD, decode_pack, encode_pack
from cas_checkpoint.format.sealing import BrokenSeal, Keyring, open_sealed_pack, seal_pack

SECRET_WORDS = ("refund-policy-7731", "Zanzibar", "label-k9", "meta-v42", "tag-q17")

_msg = partial(msg, text="the refund-policy-7731 covers Zanzibar plans ", times=7)


def _grow(store: CheckpointStore, thread: str, n: int, start: int = 0) -> dict[str, Any]:
    state: dict[str, Any] = {"messages": [_msg(i) for i in range(start)], "step": start}
    for i in range(start, start + n):
        state["messages"].append(_msg(i))
        state["step"] = i
        store.save(thread, state, label="label-k9" if i % 5 == 0 else None,
                   tags=["tag-q17"], metadata={"note": "meta-v42"})
    return state


def _opts(store: CheckpointStore) -> dict[str, Any]:
    fs = getattr(getattr(store.backend, "inner", store.backend), "fs", None)
    return dict(fs.storage_options) if store.url.startswith("s3://") and fs else {}


def _reopen(store: CheckpointStore, **kw: Any) -> CheckpointStore:
    return CheckpointStore.open(store.url, storage_options=_opts(store), **kw)


def _stored_packs(store: CheckpointStore) -> dict[str, bytes]:
    return {i.key: store.backend.get(i.key) for i in store.backend.list("packs")}


def _nodes(store: CheckpointStore, keys: Keyring | None = None) -> set[str]:
    """The ids of the state nodes stored: in packs and inside heads (decrypted with the
    store's keys)."""
    out: set[str] = set()
    for key, data in _stored_packs(store).items():
        pid = key_pack_id(key)
        assert pid is not None
        pack = parse_pack(pid, data, keys=keys)
        out |= {oid for oid, obj in pack.objects.items() if object_kind(obj) == NODE}
    for info in store.backend.list("refs/heads"):
        if info.key.endswith(".lock"):
            continue
        got = store.backend.read_ref(info.key)
        assert got is not None
        out |= {object_id(o) for o in Head.decode(got[0], info.key).inline
                if object_kind(o) == NODE}
    return out


VALUES: list[Any] = [None, True, 1 << 62, -7, 3.5, "ü" * 5000, b"\x00\xff" * 40000,
                     [1, [2, [3]]], (1, "a"), {"k": {"x": [b"1"] * 3}}, set(), frozenset({1}),
                     {"messages": [_msg(i) for i in range(200)]}, "x" * 200_000]


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_round_trips_encrypted(make_store: Any, compression: str | None) -> None:
    key = Key.generate()
    store = make_store(encryption=key, compression=compression)
    for i, value in enumerate(VALUES):
        store.save("thread Zanzibar/ü", {"v": value, "i": i}, label=f"label-k9 {i}")
    fresh = _reopen(store, encryption=key)
    assert fresh.threads() == ["thread Zanzibar/ü"]
    for info, value in zip(reversed(fresh.history("thread Zanzibar/ü")), VALUES, strict=True):
        assert fresh.load("thread Zanzibar/ü", info.id).state == {"v": value, "i": info.step}
        assert info.label == f"label-k9 {info.step}"
    packs = _stored_packs(store)
    assert packs and all(data[5] == ENCRYPTED for data in packs.values())
    plain = [open_sealed_pack(d, Keyring([key]), k) for k, d in packs.items()]
    assert any(p[5] & ZSTD for p in plain) == (compression == "zstd")
    assert fresh.settings()["encryption"] and fresh.settings()["key_id"] == key.id
    assert fresh.verify(deep=True).ok
    long_id = "a-very-long-thread-id-" * 10  # ids of any length, still hidden
    fresh.fork("thread Zanzibar/ü", fresh.head("thread Zanzibar/ü"), long_id)  # type: ignore[arg-type]
    assert sorted(_reopen(store, encryption=key).threads()) == sorted(
        ["thread Zanzibar/ü", long_id])
    assert all("Zanzibar" not in i.key and "very-long" not in i.key
               for i in store.backend.list("refs"))


def test_async_store_round_trip(tmp_path: Path) -> None:
    key = Key.generate()

    async def go() -> None:
        store = await AsyncCheckpointStore.open(str(tmp_path / "a"), encryption=key,
                                                compression="zstd")
        for i in range(40):
            await store.save("t", {"messages": [_msg(j) for j in range(i)]})
        other = await AsyncCheckpointStore.open(str(tmp_path / "a"), encryption=[key])
        assert (await other.load("t")).state == {"messages": [_msg(j) for j in range(39)]}
        assert (await other.verify()).ok
        await store.aclose()
        await other.aclose()

    asyncio.run(go())


def test_sharing_holds_with_compression_and_encryption(tmp_path: Path) -> None:
    key = Key.generate()
    plain = CheckpointStore.open(str(tmp_path / "plain"), compression="none")
    sealed = CheckpointStore.open(str(tmp_path / "sealed"), encryption=key, compression="zstd")
    for store in (plain, sealed):
        _grow(store, "t", 100)
        store.fork("t", store.history("t")[50].id, "f")
        store.repack()
        store.gc(grace=timedelta(0))
    ring = Keyring([key])
    assert _nodes(plain) == _nodes(sealed, ring)  # the same objects, named by their plaintext
    assert sealed.storage_bytes() * 2 < plain.storage_bytes()
    before = _nodes(sealed, ring)
    sealed.save("copy", sealed.load("t").state)  # a repeated state: no new node
    sealed.fork("t", sealed.head("t"), "g")  # type: ignore[arg-type]
    sealed.repack()
    assert _nodes(sealed, ring) == before
    # deterministic: the same plaintext seals to the same bytes (pack names stay stable)
    body = encode_pack({"ab" * 32: b"CASN\x03hello"})  # type: ignore[dict-item]
    assert seal_pack(body, key) == seal_pack(body, key) != seal_pack(body, Key.generate())


def test_nothing_readable_in_stored_bytes_or_paths(tmp_path: Path) -> None:
    key = Key.generate()
    root = tmp_path / "s"
    store = CheckpointStore.open(str(root), encryption=key)
    thread = "customer-Zanzibar-thread"
    _grow(store, thread, 70)
    store.fork(thread, store.history(thread)[20].id, "fork-of-Zanzibar")
    store.save("tiny Zanzibar", {"x": "refund-policy-7731"}, label="label-k9")  # inline only
    store.rewind(thread, store.history(thread)[30].id)
    store.repack(min_garbage=0.0)  # every writer of packs seals: repack, copy, bundle import
    src = CheckpointStore.open(str(tmp_path / "src"))
    _grow(src, "copied Zanzibar", 30)
    copy_threads(src, store)
    src.export_thread("copied Zanzibar", tmp_path / "b.bundle")
    store.import_bundle(tmp_path / "b.bundle", as_thread="imported Zanzibar")
    assert store.load("imported Zanzibar").state == src.load("copied Zanzibar").state
    files = [p for p in root.rglob("*") if p.is_file()]
    assert len(files) > 5
    for path in files:
        assert "Zanzibar" not in str(path.relative_to(root)), path
        data = path.read_bytes()
        for word in (*SECRET_WORDS, thread, "message 3"):
            assert word.encode() not in data, (path, word)
    # ... while a plain store shows them (the scan can fail)
    plain_root = tmp_path / "p"
    _grow(CheckpointStore.open(str(plain_root)), thread, 3)
    assert any(b"label-k9" in p.read_bytes() for p in plain_root.rglob("*") if p.is_file())


def _tamper(backend: Any, key: str, pos: int, bit: int) -> None:
    """Flip one bit of a stored pack or ref (on the storage itself, past the encryption)."""
    if key.startswith("packs"):
        data = bytearray(backend.get(key))
        data[pos % len(data)] ^= 1 << bit
        backend.delete_many([key])
        backend.put_many({key: bytes(data)})
    else:
        got = backend.read_ref(key)
        data = bytearray(got[0])
        data[pos % len(data)] ^= 1 << bit
        backend.write_ref(key, bytes(data), got[1])


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(pos=st.integers(0, 1 << 20), bit=st.integers(0, 7), which=st.sampled_from(["pack",
                                                                                    "head"]))
def test_tampering_is_refused(tmp_path_factory: Any, pos: int, bit: int, which: str) -> None:
    key = Key.generate()
    url = str(tmp_path_factory.mktemp("t"))
    store = CheckpointStore.open(url, encryption=key, compression="zstd")
    want = _grow(store, "t", 30)
    keyless = CheckpointStore.open(url, encryption="keyless")
    raw = keyless.backend.inner  # the storage itself
    ref = next(i.key for i in raw.list("refs/heads") if not i.key.endswith(".lock"))
    named = sorted(_clear_packs(keyless, ref))  # the packs the head names (not garbage)
    assert named
    target = f"packs/{named[0][:2]}/{named[0][2:]}" if which == "pack" else ref
    _tamper(raw, target, pos, bit)
    fresh = CheckpointStore.open(url, encryption=key)
    try:
        got = [fresh.load("t", i.id).state for i in fresh.history("t")]
    except (IntegrityError, FormatError) as exc:
        assert "key" in str(exc) or "damaged" in str(exc) or "tamper" in str(exc) \
            or "malformed" in str(exc) or "encrypted" in str(exc), exc
        return
    pytest.fail(f"a tampered {which} (byte {pos}, bit {bit}) read back: {len(got)} states, "
                f"the head state {'unchanged' if got[0] == want else 'CHANGED'}")


def test_a_ref_moved_to_another_thread_does_not_open(tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """A sealed head is bound to its ref key: put thread a's ref under b's key and b does not
    load a's state; the other threads are still listed; a damaged key file is refused."""
    key = Key.generate()
    url = str(tmp_path / "s")
    store = CheckpointStore.open(url, encryption=key)
    for name in ("a", "b", "c"):
        _grow(store, name, 3)
    raw = store.backend.inner
    a, b = (store.backend.ref_key(thread_key(t)) for t in "ab")
    got_a, got_b = raw.read_ref(a), raw.read_ref(b)
    assert got_a is not None and got_b is not None
    raw.write_ref(b, got_a[0], got_b[1])
    fresh = CheckpointStore.open(url, encryption=key)
    with pytest.raises(IntegrityError, match="tampered"):
        fresh.load("b")
    assert fresh.threads() == ["a", "c"]  # one bad ref hides no other
    assert "cannot be read" in caplog.text
    assert not fresh.verify().ok
    kid = Key.generate()
    both = CheckpointStore.open(url, encryption=[kid, key])
    both.save("d", {"x": 1})  # records keys/<kid.id>
    path = f"keys/{kid.id}"
    data = bytearray(raw.get(path))
    data[-1] ^= 1
    raw.delete_many([path])
    raw.put_many({path: bytes(data)})
    with pytest.raises(IntegrityError, match="tampered"):
        CheckpointStore.open(url, encryption=kid)


def test_wrong_missing_and_plain_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = Key.generate()
    url = str(tmp_path / "s")
    _grow(CheckpointStore.open(url, encryption=key), "t", 5)
    with pytest.raises(InvalidArgumentError, match=f"encrypted \\(key id {key.id}\\).*CAS_KEY"):
        CheckpointStore.open(url, create=False)  # what every CLI command does
    keyless = CheckpointStore.open(url)  # a plain open makes no request: its first use says so
    with pytest.raises(InvalidArgumentError, match="encrypted.*CAS_KEY"):
        keyless.load("t")
    with pytest.raises(InvalidArgumentError, match="encrypted.*CAS_KEY"):
        keyless.threads()
    with pytest.raises(InvalidArgumentError, match=f"encrypted \\(key id {key.id}\\)"):
        keyless.save("new thread", {"x": 1})  # nothing written in the clear
    with pytest.raises(InvalidArgumentError, match="encrypted.*CAS_KEY"):
        keyless.gc(grace=timedelta(0))
    assert keyless.verify().ok is False
    assert CheckpointStore.open(url, encryption=key).threads() == ["t"]
    with pytest.raises(InvalidArgumentError, match=f"none of the keys.*{key.id}"):
        CheckpointStore.open(url, encryption=Key.generate())
    plain = str(tmp_path / "p")
    _grow(CheckpointStore.open(plain), "t", 3)
    with pytest.raises(InvalidArgumentError, match="not encrypted"):
        CheckpointStore.open(plain, encryption=key)
    with pytest.raises(NotFoundError):
        CheckpointStore.open(str(tmp_path / "none"), encryption=key, create=False)
    for bad in (b"short", "text", [], [key, "x"], 42):
        with pytest.raises(InvalidArgumentError):
            CheckpointStore.open(str(tmp_path / "x"), encryption=bad)  # type: ignore[arg-type]
    # keys from the environment and from files
    monkeypatch.delenv("CAS_KEY", raising=False)
    with pytest.raises(InvalidArgumentError, match="CAS_KEY is not set"):
        Key.from_env("CAS_KEY")
    monkeypatch.setenv("CAS_KEY", "not a key")
    with pytest.raises(InvalidArgumentError, match="not a key"):
        Key.from_env()
    monkeypatch.setenv("CAS_KEY", key.to_text())
    assert Key.from_env() == key and Key.from_env().id == key.id
    (tmp_path / "k.hex").write_text(key._secret.hex() + "\n")
    assert Key.from_file(tmp_path / "k.hex") == key
    assert key.to_text() not in repr(key) and key.id in repr(key)
    # a provider: asked by key id
    asked: list[str] = []
    store = CheckpointStore.open(url, encryption=lambda kid: asked.append(kid) or (
        key if kid == key.id else None))
    assert store.load("t").state["step"] == 4 and asked == [key.id]


def test_rotation_and_rekey(tmp_path: Path) -> None:
    old, new = Key.generate(), Key.generate()
    url = str(tmp_path / "s")
    store = CheckpointStore.open(url, encryption=old, compression="zstd")
    want = _grow(store, "t", 60)
    store.fork("t", store.history("t")[30].id, "f")
    both = CheckpointStore.open(url, encryption=[new, old])
    more = _grow(both, "u", 30)  # new writes: under the new key
    assert both.load("t").state == want and both.load("u").state == more
    only_new = CheckpointStore.open(url, encryption=new)  # its key file was recorded
    assert only_new.load("u").state == more
    with pytest.raises(InvalidArgumentError, match=f"key id {old.id}"):
        only_new.load("t")
    report = both.rekey()
    assert report["threads"] == 3 and report["packs_rewritten"] > 0
    after = CheckpointStore.open(url, encryption=new)
    assert after.load("t").state == want and after.load("u").state == more
    assert len(after.history("f")) == 30 and after.verify(deep=True).ok
    gone = after.gc(grace=timedelta(0))
    assert gone.deleted_objects > 0  # the old key's packs were garbage
    ring = Keyring([new])
    for key, data in _stored_packs(after).items():
        assert bytes(data[6:14]).hex() == new.id, key
        open_sealed_pack(data, ring, key)
    for info in after.backend.inner.list("refs/heads"):
        data = after.backend.inner.read_ref(info.key)
        assert data is not None and data[0][5:13].hex() == new.id
    assert after.rekey()["packs_rewritten"] == 0  # nothing left under another key


CHILD = textwrap.dedent("""
    import sys
    from cas_checkpoint import CheckpointStore, Key
    url, new, old, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    store = CheckpointStore.open(url, encryption=[Key.from_text(new), Key.from_text(old)])
    state = {"messages": []}
    for i in range(n):
        state["messages"].append("child message %d " % i * 30)
        store.save("child", state)
        print(i, flush=True)
""")


def test_rekey_while_another_process_saves(tmp_path: Path) -> None:
    old, new = Key.generate(), Key.generate()
    url = str(tmp_path / "s")
    store = CheckpointStore.open(url, encryption=old)
    _grow(store, "t", 40)
    _grow(store, "child", 20)
    n = 60
    proc = subprocess.Popen([sys.executable, "-c", CHILD, url, new.to_text(), old.to_text(),
                             str(n)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()  # the child has saved once
    both = CheckpointStore.open(url, encryption=[new, old])
    reports = [both.rekey()]
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    reports.append(both.rekey())  # whatever the child's race left under the old key
    after = CheckpointStore.open(url, encryption=new)
    history = after.history("child")
    assert len(history) == 20 + n  # nothing lost
    assert after.load("child").state["messages"][-1] == f"child message {n - 1} " * 30
    assert after.count("t") == 40 and after.verify(deep=True).ok
    assert all(r["threads"] == 2 for r in reports)


def test_gc_and_quick_verify_without_the_key(tmp_path: Path) -> None:
    key = Key.generate()
    url = str(tmp_path / "s")
    store = CheckpointStore.open(url, encryption=key)
    _grow(store, "t", 80)
    store.fork("t", store.history("t")[10].id, "f")
    store.rewind("t", store.history("t")[40].id)
    store.repack()
    keyless = CheckpointStore.open(url, encryption="keyless")
    named = {p for k in (i.key for i in keyless.backend.list("refs/heads"))
             for p in _clear_packs(keyless, k)}
    dry = keyless.gc(grace=timedelta(0), dry_run=True)
    assert dry.threads == 2 and dry.deleted_objects > 0
    assert not set(dry.deleted) & named
    report = keyless.gc(grace=timedelta(0))
    assert report.deleted_objects == dry.deleted_objects
    with_key = CheckpointStore.open(url, encryption=key)
    assert len(with_key.history("f")) == 70 and with_key.verify(deep=True).ok
    assert with_key.load("f").state["step"] == 69 and with_key.count("t") == 40
    with pytest.raises(InvalidArgumentError, match="deep verify"):
        keyless.verify(deep=True)  # it could not check what it would claim to
    quick = keyless.verify(deep=False)
    assert quick.ok and quick.threads == 2
    for op in (lambda: keyless.load("t"), lambda: keyless.save("t", {}), keyless.threads):
        with pytest.raises(InvalidArgumentError, match="key"):
            op()
    victim = sorted(named)[0]
    keyless.backend.delete_many([f"packs/{victim[:2]}/{victim[2:]}"])
    broken = CheckpointStore.open(url, encryption="keyless").verify(deep=False)
    assert not broken.ok and any(p.kind == "missing" and p.object == victim
                                 for p in broken.problems)


def _clear_packs(store: CheckpointStore, key: str) -> list[str]:
    got = store.backend.read_ref(key)
    assert got is not None
    return [p.id for p in Head.decode(got[0], key).packs]


@pytest.mark.parametrize("backend_kind", ["s3"])  # S3's listing; local disk: the scan above
def test_encrypted_store_on_s3_hides_ids(make_store: Any) -> None:
    key = Key.generate()
    store = make_store(encryption=key)
    _grow(store, "Zanzibar", 40)
    listed = [i.key for p in ("refs", "packs", "keys") for i in store.backend.list(p)]
    assert listed and not any("Zanzibar" in k for k in listed)
    assert b"label-k9" not in store.backend.get(MARKER)
    assert _reopen(store, encryption=key).load("Zanzibar").state["step"] == 39
    assert _reopen(store, encryption="keyless").gc(grace=timedelta(seconds=1)).threads == 1


ENV = {"COLUMNS": "200"}


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The command line in-process, CAS_KEY set only if ``env`` has it."""
    return run_cli_proc(*args, env={"CAS_KEY": None, **env})


def test_cli_reads_cas_key_and_key_file(tmp_path: Path) -> None:
    old, new = Key.generate(), Key.generate()
    url = str(tmp_path / "s")
    env = {k: v for k, v in ENV.items() if k != "CAS_KEY"}
    got = _cli("init", url, "--compression", "zstd", env={**env, "CAS_KEY": old.to_text()})
    assert got.returncode == 0, got.stderr
    store = CheckpointStore.open(url, encryption=old)
    _grow(store, "Zanzibar", 20)
    listed = _cli("threads", url, env={**env, "CAS_KEY": old.to_text()})
    assert listed.returncode == 0 and "Zanzibar" in listed.stdout, listed.stderr
    missing = _cli("threads", url, env=env)
    assert missing.returncode == 2 and "encrypted" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    (tmp_path / "new.key").write_text(new.to_text())
    (tmp_path / "old.key").write_text(old._secret.hex())
    rekeyed = _cli("rekey", url, "--key-file", str(tmp_path / "new.key"), "--key-file",
                   str(tmp_path / "old.key"), env=env)
    assert rekeyed.returncode == 0 and "rekeyed 1 thread " in rekeyed.stdout, rekeyed.stderr
    log = _cli("log", url, "Zanzibar", "--key-file", str(tmp_path / "new.key"), env=env)
    assert log.returncode == 0 and log.stdout.count("\n") >= 20, log.stderr
    assert CheckpointStore.open(url, encryption=new).load("Zanzibar").state["step"] == 19
    wrong = _cli("threads", url, env={**env, "CAS_KEY": Key.generate().to_text()})
    assert wrong.returncode == 2 and "none of the keys" in wrong.stderr


def test_cli_keyless_gc_and_verify(tmp_path: Path) -> None:
    key = Key.generate()
    url = str(tmp_path / "s")
    store = CheckpointStore.open(url, encryption=key)
    _grow(store, "Zanzibar", 60)
    store.rewind("Zanzibar", store.history("Zanzibar")[30].id)
    store.repack()  # the dropped half is in packs no head names
    env = {k: v for k, v in ENV.items() if k != "CAS_KEY"}
    ok = _cli("verify", url, "--keyless", "--json", env=env)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["ok"] is True and "Zanzibar" not in ok.stdout
    gc = _cli("gc", url, "--keyless", "--grace", "0s", "--force", "--json", env=env)
    assert gc.returncode == 0, gc.stderr
    assert json.loads(gc.stdout)["deleted_objects"] > 0
    assert CheckpointStore.open(url, encryption=key).load("Zanzibar").state["step"] == 29
    deep = _cli("verify", url, "--keyless", "--deep", env=env)
    assert deep.returncode == 2 and "key" in deep.stderr, deep.stderr
    both = _cli("threads", url, "--keyless", "--key-file", "x", env=env)
    assert both.returncode == 2 and "--keyless" in both.stderr
    pack = next(i.key for i in store.backend.inner.list("packs"))
    store.backend.inner.delete_many([pack])
    broken = _cli("verify", url, "--keyless", env=env)
    assert broken.returncode == 1 and "missing" in broken.stdout, broken.stdout


def test_cli_keygen_makes_a_key_that_opens_a_store(tmp_path: Path) -> None:
    env = {k: v for k, v in ENV.items() if k != "CAS_KEY"}
    made = _cli("keygen", env=env)
    assert made.returncode == 0, made.stderr
    key = Key.from_text(made.stdout)
    assert key.id in made.stderr and made.stdout.strip() not in made.stderr
    other = _cli("keygen", "--json", env=env)
    assert json.loads(other.stdout)["key"] != made.stdout.strip()
    url = str(tmp_path / "s")
    got = _cli("init", url, env={**env, "CAS_KEY": made.stdout.strip()})
    assert got.returncode == 0, got.stderr
    assert CheckpointStore.open(url, encryption=key).settings()["key_id"] == key.id


def test_errors_are_cas_errors(tmp_path: Path) -> None:
    """A damaged key id in a pack header names the key it wants; never a crash."""
    key = Key.generate()
    url = str(tmp_path / "s")
    store = CheckpointStore.open(url, encryption=key)
    _grow(store, "t", 40)
    raw = store.backend.inner
    k = sorted(i.key for i in raw.list("packs"))[0]
    data = raw.get(k)
    pid = key_pack_id(k)
    assert pid is not None
    with pytest.raises(InvalidArgumentError, match="key id"):
        parse_pack(pid, data, keys=Keyring([Key.generate()]))
    with pytest.raises(FormatError, match="encrypted"):
        decode_pack(data)
    assert issubclass(BrokenSeal, IntegrityError) and issubclass(IntegrityError, CasError)


def test_sealing_a_head_lists_the_packs_of_exactly_those_bytes(monkeypatch: Any) -> None:
    """A save seals the head it just encoded without decoding it again (its packs are known);
    any other bytes, an older head's or an equal copy, are decoded: the clear pack list of a
    sealed head is always that of the bytes sealed, never of the head encoded last."""
    from cas_checkpoint.format import heads
    from cas_checkpoint.format.sealing import _clear_part, seal_head

    key = Key.generate()

    def packs(n: int) -> tuple[heads.PackRef, ...]:
        return tuple(heads.PackRef(object_id(bytes([n, i])), 0, 100 + i, 3) for i in range(n))

    a = Head("t", None, packs=packs(2)).encode()
    b = Head("t", None, packs=packs(3)).encode()
    want_b = [(p.id, p.size) for p in packs(3)]
    decoded: list[bytes] = []
    real = heads.Head.decode

    def counting(data: Any, path: str = "ref") -> Head:
        decoded.append(bytes(data))
        return real(data, path)

    monkeypatch.setattr(heads.Head, "decode", staticmethod(counting))
    assert _clear_part(seal_head(b, key, "refs/heads/x"), "x")[1] == want_b
    assert decoded == []  # the head encoded last: its packs were known
    assert _clear_part(seal_head(a, key, "refs/heads/x"), "x")[1] == [
        (p.id, p.size) for p in packs(2)]  # an older head: decoded, its own packs
    assert decoded == [a]
    assert _clear_part(seal_head(bytes(bytearray(b)), key, "refs/heads/x"), "x")[1] == want_b
