"""Bundles (export_thread / import_bundle) and store-to-store copies (copy_threads): round trips
between local disk and S3 (moto server), forks and merges, writing only what is missing,
fast-forward and refusal, hostile bundles, a copy killed with SIGKILL and resumed, and the
requests an import costs on S3."""

from __future__ import annotations

import asyncio
import io
import json
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import blake3
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_packs import S3Requests

import cas_checkpoint
from cas_checkpoint import (
    BundleReport,
    CasError,
    CheckpointStore,
    ConflictError,
    CopyReport,
    FormatError,
    IntegrityError,
    InvalidArgumentError,
    NotFoundError,
    copy_threads,
)
from cas_checkpoint.aio import AsyncCheckpointStore, acopy_threads
from cas_checkpoint.format.objects import object_id
from cas_checkpoint.format.pack import decode_pack
from cas_checkpoint.transfer import copy as copymod
from cas_checkpoint.transfer import receive as receivemod
from cas_checkpoint.transfer.bundle import MAGIC, VERSION

ROOT = Path(__file__).resolve().parent.parent


def _s3(moto_server: dict[str, Any], **kw: Any) -> CheckpointStore:
    return CheckpointStore.open(f"s3://{moto_server['bucket']}/b-{uuid.uuid4().hex[:10]}",
                                storage_options={**moto_server["storage_options"], **kw})


def _local(tmp_path: Path, **kw: Any) -> CheckpointStore:
    return CheckpointStore.open(str(tmp_path / f"store-{uuid.uuid4().hex[:8]}"), **kw)


def _mem() -> CheckpointStore:
    return CheckpointStore.open(f"memory://bundle-{uuid.uuid4().hex[:10]}")


def _text(seed: int, words: int = 60) -> str:
    rng = random.Random(seed)
    return " ".join("".join(rng.choice("abcdefghijklmnop") for _ in range(7))
                    for _ in range(words))


def _state(tag: str, n: int) -> dict[str, Any]:
    seed = int.from_bytes(blake3.blake3(tag.encode()).digest()[:4], "big")
    return {"messages": [{"role": "user" if i % 2 else "assistant",
                          "content": _text(seed + i)} for i in range(n)],
            "step": n, "note": f"{tag}-{n}"}


def _populate(store: CheckpointStore, n: int = 24) -> dict[str, Any]:
    """Thread "a" (labels, tags, metadata on some), fork "b" of it with its own saves, and a
    merge in "a" (a checkpoint with two parents: one from "b")."""
    ids = []
    for i in range(1, n + 1):
        info = store.save("a", _state("a", i), label=f"L{i}" if i % 5 == 0 else None,
                          tags=["tool", f"t{i % 3}"] if i % 4 == 0 else (),
                          metadata={"i": i, "who": "agent"} if i % 3 == 0 else None)
        ids.append(info.id)
    store.fork("a", ids[n // 2], "b")
    fork_ids = [store.save("b", {**_state("a", n // 2 + 1), "fork": k}).id for k in range(4)]
    merged = store._run(store._core.save("a", {**_state("a", n), "merged": True},
                                         parents=[ids[-1], fork_ids[-1]], label="merge"))
    return {"a": ids, "b": fork_ids, "merge": merged.id}


def _same_thread(src: CheckpointStore, dst: CheckpointStore, thread: str,
                 dst_thread: str | None = None) -> int:
    """Every checkpoint of ``thread`` loads the same state, ids, parents, labels, tags and
    metadata from ``dst``; returns how many were compared."""
    dst_thread = dst_thread or thread
    want = src.history(thread)
    got = dst.history(dst_thread)
    assert [c.id for c in got] == [c.id for c in want]
    assert dst.head(dst_thread) == src.head(thread)
    for a, b in zip(want, got, strict=True):
        assert (a.parent_ids, a.label, a.tags, a.metadata, a.step, a.created_at, a.size) == (
            b.parent_ids, b.label, b.tags, b.metadata, b.step, b.created_at, b.size)
        assert dst.load(dst_thread, b.id).state == src.load(thread, a.id).state
    return len(want)


def _records(data: bytes) -> list[tuple[bytes, bytes]]:
    """A bundle's records (kind, body), read with the plain framing."""
    out, pos = [], len(MAGIC) + 1
    while pos < len(data):
        kind, (length,) = data[pos:pos + 1], struct.unpack(">I", data[pos + 1:pos + 5])
        out.append((kind, data[pos + 5:pos + 5 + length]))
        pos += 5 + length
    return out


def _bundle_ids(data: bytes) -> list[str]:
    """The object ids a bundle carries, in order."""
    return [body[:32].hex() for kind, body in _records(data) if kind == b"O"]


def _reframe(records: list[tuple[bytes, bytes]], *, fix_trailer: bool = True) -> bytes:
    """A bundle from its records; with ``fix_trailer`` the trailer's digest and counts are
    recomputed, so only the deeper checks can catch what was changed."""
    out = bytearray(MAGIC + bytes([VERSION]))
    for kind, body in records:
        if kind == b"Z" and fix_trailer:
            trailer = msgpack.unpackb(body)
            trailer["digest"] = blake3.blake3(bytes(out)).digest()
            body = msgpack.packb(trailer, use_bin_type=True)
        out += kind + struct.pack(">I", len(body)) + body
    return bytes(out)


def _export_bytes(store: CheckpointStore, thread: str) -> bytes:
    buf = io.BytesIO()
    store.export_thread(thread, buf)
    return buf.getvalue()


# --- round trips -------------------------------------------------------------------------------


def test_round_trip_local_to_s3_and_back(tmp_path: Path, moto_server: dict[str, Any]) -> None:
    local = _local(tmp_path)
    made = _populate(local)
    path = tmp_path / "a.bundle"
    seen: list[tuple[int, int | None]] = []
    out = local.export_thread("a", path, progress=lambda d, t: seen.append((d, t)))
    assert isinstance(out, BundleReport) and out.status == "exported"
    assert out.bytes == path.stat().st_size and out.objects == len(_bundle_ids(path.read_bytes()))
    assert out.checkpoints == local.count("a") and seen[-1] == (out.objects, out.objects)
    assert not list(tmp_path.glob("a.bundle.tmp-*"))  # written beside, renamed into place

    s3 = _s3(moto_server)
    got = s3.import_bundle(path)
    assert (got.thread_id, got.status, got.objects) == ("a", "created", out.objects)
    assert got.objects_written == out.objects  # an empty store holds nothing
    assert _same_thread(local, s3, "a") == len(made["a"]) + 1  # and the merge
    merge = s3.load("a", made["merge"])
    assert merge.parent_ids == (made["a"][-1], made["b"][-1]) and merge.label == "merge"
    assert s3.verify().ok

    back = tmp_path / "back.bundle"
    s3.export_thread("a", back)
    again = _local(tmp_path)
    assert again.import_bundle(back, as_thread="copy").status == "created"
    _same_thread(local, again, "a", "copy")
    assert _bundle_ids(back.read_bytes()) == _bundle_ids(path.read_bytes())  # same order


def test_fork_bundle_keeps_its_ancestry(tmp_path: Path) -> None:
    src = _local(tmp_path)
    made = _populate(src)
    dst = _mem()
    dst.import_bundle(io.BytesIO(_export_bytes(src, "b")))
    _same_thread(src, dst, "b")
    ancestry = [c.id for c in dst.history("b")]
    assert made["a"][0] in ancestry and made["a"][12] in ancestry
    assert made["a"][13] not in ancestry  # after the fork point: not the fork's history


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_async_faces(tmp_path: Path, request: pytest.FixtureRequest, kind: str) -> None:
    src = _local(tmp_path)
    _populate(src, 10)
    path = tmp_path / "x.bundle"
    url, opts = str(tmp_path / "async-dst"), None
    if kind == "s3":
        server = request.getfixturevalue("moto_server")
        url = f"s3://{server['bucket']}/async-{uuid.uuid4().hex[:8]}"
        opts = server["storage_options"]

    async def go() -> tuple[BundleReport, BundleReport]:
        a = await AsyncCheckpointStore.open(src.url)
        b = await AsyncCheckpointStore.open(url, storage_options=opts)
        try:
            out = await a.export_thread("a", path)
            into = await b.import_bundle(path)
            assert await b.head("a") == src.head("a")
            return out, into
        finally:
            await a.aclose()
            await b.aclose()

    out, into = asyncio.run(go())
    assert out.objects == into.objects == into.objects_written
    _same_thread(src, CheckpointStore.open(url, storage_options=opts), "a")


# --- writing only what is missing ----------------------------------------------------------------


def test_import_twice_writes_nothing_and_fast_forwards(tmp_path: Path) -> None:
    src = _local(tmp_path)
    for i in range(1, 21):
        src.save("t", _state("t", i))
    first = _export_bytes(src, "t")
    dst = _local(tmp_path)
    one = dst.import_bundle(io.BytesIO(first))
    assert one.objects_written == one.objects > 0
    packs_before = sorted(i.key for i in dst.backend.list("packs"))
    two = dst.import_bundle(io.BytesIO(first))
    assert (two.status, two.objects_written, two.objects) == ("unchanged", 0, one.objects)
    assert sorted(i.key for i in dst.backend.list("packs")) == packs_before

    for i in range(21, 31):  # the source goes on: the old history is a prefix of the new
        src.save("t", _state("t", i), label="late" if i == 30 else None)
    second = _export_bytes(src, "t")
    ff = dst.import_bundle(io.BytesIO(second))
    new_objects = set(_bundle_ids(second)) - set(_bundle_ids(first))
    assert ff.status == "fast-forward"
    assert ff.objects_written == len(new_objects) > 0
    assert ff.objects == len(_bundle_ids(second))
    _same_thread(src, dst, "t")
    assert dst.verify().ok


def test_import_into_a_store_holding_a_fork_writes_only_the_new_part(tmp_path: Path) -> None:
    src = _local(tmp_path)
    ids = [src.save("t", _state("t", i)).id for i in range(1, 41)]
    src.fork("t", ids[29], "f")
    for k in range(5):
        src.save("f", {**_state("t", 30), "k": k})
    fork, main = _export_bytes(src, "f"), _export_bytes(src, "t")
    dst = _mem()
    dst.import_bundle(io.BytesIO(fork))
    got = dst.import_bundle(io.BytesIO(main))
    only_main = set(_bundle_ids(main)) - set(_bundle_ids(fork))
    assert got.status == "created" and got.objects_written == len(only_main)
    assert 0 < got.objects_written < got.objects
    _same_thread(src, dst, "t")
    _same_thread(src, dst, "f")
    # and the other way round: a fork imported into a store holding its source thread
    other = _mem()
    other.import_bundle(io.BytesIO(main))
    got = other.import_bundle(io.BytesIO(fork), as_thread="the-fork")
    assert got.objects_written == len(set(_bundle_ids(fork)) - set(_bundle_ids(main)))
    _same_thread(src, other, "f", "the-fork")
    assert other.verify().ok


def test_conflicting_thread_is_refused(tmp_path: Path) -> None:
    src = _mem()
    for i in range(1, 6):
        src.save("t", _state("t", i))
    data = _export_bytes(src, "t")
    dst = _mem()
    theirs = dst.save("t", {"something": "else"}).id
    with pytest.raises(ConflictError, match="as_thread"):
        dst.import_bundle(io.BytesIO(data))
    assert dst.head("t") == theirs and dst.count("t") == 1  # untouched
    assert dst.import_bundle(io.BytesIO(data), as_thread="t-imported").status == "created"
    _same_thread(src, dst, "t", "t-imported")
    # a longer history in the store (the bundle is its prefix) is not cut back either
    dst.save("t-imported", {"more": 1})
    with pytest.raises(ConflictError):
        dst.import_bundle(io.BytesIO(data), as_thread="t-imported")
    assert dst.count("t-imported") == 6


def test_bad_arguments(tmp_path: Path) -> None:
    store = _mem()
    store.save("t", {"x": 1})
    with pytest.raises(NotFoundError):
        store.export_thread("nope", tmp_path / "x.bundle")
    assert not (tmp_path / "x.bundle").exists()
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        store.import_bundle(tmp_path / "missing.bundle")
    with pytest.raises(InvalidArgumentError):
        store.export_thread("t", 42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        store.import_bundle(io.BytesIO(_export_bytes(store, "t")), as_thread="")
    with pytest.raises(InvalidArgumentError):
        copy_threads(store, _mem(), "t")  # a str is not a list of threads
    with pytest.raises(NotFoundError):
        copy_threads(store, _mem(), ["nope"])
    with pytest.raises(InvalidArgumentError):
        copy_threads(store, object())


class _Writes(io.BytesIO):
    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def write(self, data: Any) -> int:
        self.sizes.append(len(data))
        return super().write(data)


def test_streams_in_bounded_pieces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file is written in chunks, not built whole; an import writes new objects in packs
    of PACK_BYTES as they come, not all at the end."""
    from cas_checkpoint.transfer import bundle

    src = _mem()
    for i in range(1, 41):
        src.save("t", _state("s", i))
    monkeypatch.setattr(bundle, "CHUNK", 2048)
    out = _Writes()
    report = src.export_thread("t", out)
    largest = max(len(b) for _, b in _records(out.getvalue()))
    assert len(out.sizes) > 10 and max(out.sizes) <= 2048 + 5 + largest
    assert sum(out.sizes) == report.bytes

    monkeypatch.setattr(receivemod, "PACK_BYTES", 8192)
    written: list[int] = []
    real = receivemod.make_pack

    def spy(objects: Any, level: int, compressor: Any = None) -> Any:
        written.append(sum(len(v) for v in objects.values()))
        return real(objects, level, compressor)

    monkeypatch.setattr(receivemod, "make_pack", spy)
    dst = _local(tmp_path, compression="none")  # packs as large as what went into them
    got = dst.import_bundle(io.BytesIO(out.getvalue()))
    assert len(written) >= 4 and max(written) < 8192 + largest
    assert len(dst.refs.read("t").head.packs) >= len(written) - 1
    assert got.bytes_written >= sum(written)
    _same_thread(src, dst, "t")
    assert dst.verify().ok


def test_async_copy() -> None:
    src = _mem()
    _populate(src, 6)

    async def go() -> CopyReport:
        a = await AsyncCheckpointStore.open(src.url)
        b = await AsyncCheckpointStore.open(f"memory://acopy-{uuid.uuid4().hex[:8]}")
        got = await acopy_threads(a, b)
        assert await b.threads() == ["a", "b"]
        with pytest.raises(InvalidArgumentError, match="acopy_threads"):
            copy_threads(src, b)
        return got

    got = asyncio.run(go())
    assert got.threads == ["a", "b"] and 0 < got.objects_written < got.objects


# --- hostile and damaged bundles ----------------------------------------------------------------


@pytest.fixture(scope="module")
def sample() -> bytes:
    store = _mem()
    _populate(store, 8)
    return _export_bytes(store, "a")


def _import_fails(data: bytes) -> CasError:
    dst = _mem()
    with pytest.raises(CasError) as info:
        dst.import_bundle(io.BytesIO(data))
    assert dst.threads() == []  # never a half-imported thread
    assert isinstance(info.value, (FormatError, IntegrityError)), repr(info.value)
    return info.value


def test_truncated_anywhere(sample: bytes) -> None:
    cuts = sorted({*range(0, 64), *range(0, len(sample), 97), len(sample) - 1})
    for cut in cuts:
        err = _import_fails(sample[:cut])
        assert "truncat" in str(err) or "magic" in str(err) or "lacks" in str(err), (cut, err)


def test_every_flipped_byte_is_caught(sample: bytes) -> None:
    for pos in range(0, len(sample), 13):
        damaged = bytearray(sample)
        damaged[pos] ^= 0x41
        _import_fails(bytes(damaged))


@settings(max_examples=int(os.environ.get("CAS_FUZZ_EXAMPLES", "150")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # CAS_FUZZ_EXAMPLES=5000: a long run
@given(data=st.data())
def test_fuzz_only_cas_errors(sample: bytes, data: st.DataObject) -> None:
    """Random flips, cuts and splices of a real bundle: a CasError, never anything else (no
    state payload is decoded on import, so nothing here can overflow the C stack)."""
    raw = bytearray(sample)
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255)) if raw[pos] else 1
    if data.draw(st.booleans()):
        raw = raw[:data.draw(st.integers(0, len(raw)))]
    if bytes(raw) == sample:
        return
    dst = _mem()
    with pytest.raises(CasError):
        dst.import_bundle(io.BytesIO(bytes(raw)))
    assert dst.threads() == []


def test_hostile_bundles(sample: bytes) -> None:
    records = _records(sample)
    assert [k for k, _ in records][:2] == [b"H", b"E"] and records[-1][0] == b"Z"
    objects = [i for i, (k, _) in enumerate(records) if k == b"O"]

    # lying lengths: more than any record may hold, and more than the file holds
    i = objects[0]
    huge = bytearray(_reframe(records))
    at = len(MAGIC) + 1 + sum(5 + len(b) for _, b in records[:i]) + 1
    huge[at:at + 4] = struct.pack(">I", 0xFFFFFFFF)
    assert "more than any valid" in str(_import_fails(bytes(huge)))
    huge[at:at + 4] = struct.pack(">I", 50_000_000)
    assert "truncated" in str(_import_fails(bytes(huge)))

    # huge claimed counts in the header (the digest is recomputed: only the counts lie)
    header = msgpack.unpackb(records[0][1])
    for key, value in (("entries", 1 << 60), ("objects", 1 << 60), ("objects", 3)):
        lying = [(b"H", msgpack.packb({**header, key: value}, use_bin_type=True)),
                 *records[1:]]
        _import_fails(_reframe(lying))

    # an object nothing names (a valid node, correctly hashed)
    from cas_checkpoint.format.objects import encode_node

    stray = encode_node(b"\xa5stray")
    extra = [*records[:-1], (b"O", bytes.fromhex(object_id(stray)) + stray), records[-1]]
    assert "named by no checkpoint" in str(_import_fails(_reframe(extra)))

    # an object left out: the checkpoints need it
    missing = [r for j, r in enumerate(records) if j != objects[-1]]
    assert "lacks" in str(_import_fails(_reframe(missing)))

    # an object whose bytes do not hash to the id it comes with
    oid, body = records[objects[1]][1][:32], bytearray(records[objects[1]][1][32:])
    body[-1] ^= 1
    bad = [*records[:objects[1]], (b"O", oid + bytes(body)), *records[objects[1] + 1:]]
    assert isinstance(_import_fails(_reframe(bad)), IntegrityError)

    # a history that does not hash: the log says other metadata than the records
    entries = msgpack.unpackb(records[1][1], strict_map_key=False)
    entries[-1][7] = {"forged": True}
    forged = [records[0], (b"E", msgpack.packb(entries, use_bin_type=True)), *records[2:]]
    assert "does not say what its record says" in str(_import_fails(_reframe(forged)))

    # the head the header names is not in the log
    lie = [(b"H", msgpack.packb({**header, "head": b"\x01" * 32}, use_bin_type=True)),
           *records[1:]]
    assert "head" in str(_import_fails(_reframe(lie)))

    # a trailer whose digest was not recomputed after a change in the header
    changed = [(b"H", msgpack.packb({**header, "created": 0.0}, use_bin_type=True)),
               *records[1:]]
    assert isinstance(_import_fails(_reframe(changed, fix_trailer=False)), IntegrityError)

    # bytes after the trailer, another format version, not a bundle at all
    assert "after its trailer" in str(_import_fails(sample + b"\x00"))
    newer = bytearray(sample)
    newer[len(MAGIC)] = VERSION + 1
    assert "upgrade" in str(_import_fails(bytes(newer)))
    assert "magic" in str(_import_fails(b"PK\x03\x04" + sample))


# --- copy between stores ---------------------------------------------------------------------


def test_copy_local_to_s3_and_s3_to_local(tmp_path: Path, moto_server: dict[str, Any]) -> None:
    local = _local(tmp_path)
    _populate(local, 12)
    local.save("c", {"other": _text(7)})
    s3 = _s3(moto_server)
    ticks: list[int] = []
    got = copy_threads(local, s3, progress=lambda d, t: ticks.append(d))
    assert isinstance(got, CopyReport) and got.threads == ["a", "b", "c"]
    assert got.objects == ticks[-1] and got.objects_written < got.objects  # b shares a's
    for t in got.threads:
        _same_thread(local, s3, t)
    again = copy_threads(local, s3)
    assert again.objects_written == 0 and again.bytes_written == 0
    back = _local(tmp_path)
    one = copy_threads(s3, back, ["b"])
    assert one.threads == ["b"] and back.threads() == ["b"]
    _same_thread(local, back, "b")
    assert back.verify().ok and s3.verify().ok


_KILL_SCRIPT = textwrap.dedent("""
    import json, sys
    from cas_checkpoint import CheckpointStore, copy_threads
    from cas_checkpoint.transfer import receive
    receive.PACK_BYTES = 4096
    args = json.loads(sys.argv[1])
    src = CheckpointStore.open(args["src"])
    dst = CheckpointStore.open(args["dst"], storage_options=args["options"])
    def progress(done, total):
        print(done, flush=True)
    copy_threads(src, dst, progress=progress)
    print("finished", flush=True)
""")


def _ids_in(store: CheckpointStore) -> set[str]:
    """Every object the store has: in its packs (named or not) and inline in its refs."""
    out: set[str] = set()
    for info in store.backend.list("packs"):
        out.update(decode_pack(store.backend.get(info.key)))
    for thread in store.threads():
        ref = store.refs.read(thread)
        out.update(object_id(d) for d in ref.head.inline)
    return out


def _walks(store: CheckpointStore) -> dict[str, list[str]]:
    """The objects a copy sends for each thread, in order."""
    out: dict[str, list[str]] = {}
    for thread in store.threads():
        source = copymod.ThreadSource(store._core, thread)
        store._run(source.header())
        out[thread] = list(store._run(source.walk()))
    return out


@pytest.mark.parametrize("during", ["a", "c"])
def test_copy_killed_with_sigkill_resumes(tmp_path: Path, moto_server: dict[str, Any],
                                          monkeypatch: pytest.MonkeyPatch, during: str) -> None:
    """Killed while copying thread ``a`` (the first) or ``c`` (the last): the threads before it
    are whole in S3, the one it was copying is absent, and a second run writes exactly the
    objects the first did not leave there."""
    src = _local(tmp_path)
    ids = [src.save("a", _state("k", i)).id for i in range(1, 41)]
    src.fork("a", ids[25], "b")
    for k in range(6):
        src.save("b", {**_state("k", 26), "k": _text(1000 + k)})
    for i in range(1, 16):
        src.save("c", {"log": [_text(5000 + j) for j in range(i)]})
    walks = _walks(src)
    needed = {oid for walk in walks.values() for oid in walk}
    before = ["a", "b", "c"][:["a", "b", "c"].index(during)]
    kill_at = sum(len(walks[t]) for t in before) + len(walks[during]) // 2
    dst = _s3(moto_server)
    args = {"src": src.url, "dst": dst.url, "options": moto_server["storage_options"]}
    proc = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, json.dumps(args)],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip().isdigit() and int(line) >= kill_at:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(60)
    assert proc.returncode == -signal.SIGKILL

    fresh = CheckpointStore.open(dst.url, storage_options=moto_server["storage_options"])
    assert fresh.threads() == before  # the thread being copied is not there at all
    for t in before:  # those before it are whole
        _same_thread(src, fresh, t)
    assert fresh.verify().ok
    had = _ids_in(fresh) & needed
    assert had - {oid for t in before for oid in walks[t]}  # and work of the killed thread

    monkeypatch.setattr(receivemod, "PACK_BYTES", 4096)
    done = copy_threads(src, fresh)
    assert done.objects_written == len(needed - had)  # only what the first run did not write
    for t in ("a", "b", "c"):
        _same_thread(src, fresh, t)
    assert fresh.verify().ok
    assert copy_threads(src, fresh).objects_written == 0


# --- requests on S3 --------------------------------------------------------------------------


def test_s3_requests_of_an_import_the_store_already_holds(tmp_path: Path,
                                                          moto_server: dict[str, Any]) -> None:
    src = _mem()
    for i in range(1, 61):
        src.save("t", _state("r", i))
    data = _export_bytes(src, "t")
    first = _s3(moto_server)
    first.import_bundle(io.BytesIO(data))
    packs = len(first.refs.read("t").head.packs)
    assert packs >= 1

    own = {**moto_server["storage_options"], "skip_instance_cache": True}
    cold = CheckpointStore.open(first.url, storage_options=own)
    count = S3Requests(cold)
    cold.save("warm-up", {"x": 1})  # the first write probes the endpoint: not counted
    count.take()

    same = cold.import_bundle(io.BytesIO(data))
    ops = count.take()
    assert same.status == "unchanged" and same.objects_written == 0
    assert ops == ["GetObject"] * (1 + packs), ops  # the ref and its packs: no object GETs

    renamed = cold.import_bundle(io.BytesIO(data), as_thread="t2")
    ops = count.take()
    assert renamed.status == "created" and renamed.objects_written == 0
    # the refs listed and read (2 threads), the ref written: packs are cached, none written;
    # and t's ref read again and rewritten with its packs marked held (t2 names them: their
    # writers must not delete them, collect.py)
    assert sorted(ops) == sorted(["ListObjectsV2", "GetObject", "GetObject", "GetObject",
                                  "GetObject", "PutObject", "PutObject"]), ops
    assert cold.load("t2").state == src.load("t").state
    assert cold.refs.read("t2").head.packs == cold.refs.read("t").head.packs

    assert cas_checkpoint.copy_threads(src, cold, ["t"]).objects_written == 0
    assert all(op != "PutObject" for op in count.take())
    count.close()
