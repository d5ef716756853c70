"""Client-side encryption that keeps deduplication: keys, sealed packs and heads, hidden ref
names, rotation.

What a storage reader sees of an encrypted store: the root object ``cas-store`` (it says the
store is encrypted, and which key created it), ``keys/<key id>`` files (a random *names secret*
wrapped under each later key), packs and refs. Nothing of it shows content, thread ids, labels
or metadata:

* **packs** (``packs/ab/...``): a clear header (``CAS`` ``P`` version, flags = ``ENCRYPTED``, the
  8-byte key id), then AES-256-GCM of the whole plain (or zstd-compressed) pack. A pack is still
  named by the BLAKE3 of its stored bytes, so reads are checked before decryption, and gc and a
  key-less quick verify still work on names;
* **heads** (``refs/heads/e-<hex>``): the ref key is a BLAKE3 keyed by the names secret, so it
  shows no thread id; the ref holds a clear header (``CAS`` ``E`` version, key id, the ids and
  sizes of the packs it names: all gc needs), then AES-256-GCM of the whole plain head
  (thread id, log, inline objects). The associated data binds it to its ref key and its clear
  part.

Encryption is deterministic and nonce-safe (SIV style): the 96-bit nonce is a BLAKE3, keyed by a
subkey of the key, of the associated data and the plaintext. Equal plaintext gives equal
ciphertext (so pack names stay deterministic: a resumed copy writes the same packs), and two
different plaintexts under one key share a nonce only by a 96-bit hash collision. Objects
inside keep their plain content addresses: nodes shared by threads and forks are shared as
before, and every object is re-hashed after decryption.

The backend is wrapped (``SealedBackend``): ref keys are renamed and ref bytes sealed on their
way to storage, so every part of the store that reads or writes refs works unchanged.
"""

from __future__ import annotations

import base64
import binascii
import builtins
import os
import secrets
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import blake3

from . import marker
from .backends import Backend, ObjectInfo
from .errors import FormatError, IntegrityError, InvalidArgumentError
from .heads import MAX_HEAD_BYTES, Head, PackRef, packs_of
from .objects import _HEADERS, PACK, VERSION, ObjectId
from .ops import GetMany, List, PutMany, Step
from .packfile import ENCRYPTED

CIPHER = marker.ENCRYPTION  # as the store's settings name it
KEYLESS = "keyless"  # encryption=KEYLESS: gc and a quick verify, without the key
KEYS = "keys"  # keys/<key id>: the names secret, wrapped under that key
HEADS = "refs/heads"
SEALED_HEAD = b"CASE" + bytes([VERSION])
_CTX = "cas_checkpoint 2026-11 "
_ID = 8  # bytes of a key id
_NONCE, _TAG = 12, 16
_PACK_CLEAR = 5 + 1 + _ID


class BrokenSeal(IntegrityError):
    """An encrypted pack, head or key file whose authentication tag does not hold: its bytes
    were changed (or it was sealed by another key with the same id, which does not happen)."""

    def __init__(self, path: str) -> None:
        Exception.__init__(self, f"{path} is damaged or was tampered with: its encryption tag "
                           "does not verify, so nothing of it was returned. Run "
                           "`cas-checkpoint verify`, and restore it from a backup or replica")
        self.expected, self.actual, self.path = "an authentic tag", "a wrong tag", path


class DamagedKeyId(IntegrityError):
    """An encrypted pack or ref whose clear key id is not that of the key that sealed it: a
    given key opens it under its own id, or the id differs from one the store uses in a few
    bits only. Damage, not a missing key."""

    def __init__(self, path: str, kid: str, near: str, opened: bool) -> None:
        how = (f"key {near} opens it under its own id" if opened else
               f"it differs from key id {near}, which the store uses, in a few bits only")
        Exception.__init__(self, f"{path} is damaged: its clear key id {kid} is not the one it "
                           f"was sealed with ({how}), so nothing of it was returned. Run "
                           "`cas-checkpoint verify`, and restore it from a backup or replica")
        self.expected, self.actual, self.path = near, kid, path


NEAR_BITS = 4  # a key id this close to a known one is that id damaged (random ids differ in ~32)


def _near(kid: str, known: Iterable[str]) -> str | None:
    """A known key id that ``kid`` differs from in 1..NEAR_BITS bits (None if there is none)."""
    try:
        mine = int(kid, 16)
    except ValueError:
        return None
    for other in known:
        try:
            bits = (int(other, 16) ^ mine).bit_count()
        except ValueError:
            continue
        if 0 < bits <= NEAR_BITS:
            return other
    return None


def _derive(purpose: str, secret: bytes) -> bytes:
    return blake3.blake3(secret, derive_key_context=_CTX + purpose).digest()


class Key:
    """A 32-byte secret key. ``key.id`` (16 hex digits) is derived from it and names it in
    stored headers; the key itself is never stored."""

    __slots__ = ("_aead", "_nonce", "_secret", "id")

    def __init__(self, secret: bytes) -> None:
        if not isinstance(secret, bytes | bytearray) or len(secret) != 32:
            raise InvalidArgumentError(
                "a Key is 32 random bytes (Key.generate(), or Key.from_env('CAS_KEY') with "
                "base64 or hex text), not " + (f"{len(secret)} bytes" if isinstance(
                    secret, bytes | bytearray) else type(secret).__name__))
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._secret = bytes(secret)
        self.id = _derive("key id", self._secret)[:_ID].hex()
        self._aead = AESGCM(_derive("aes-256-gcm", self._secret))
        self._nonce = _derive("siv nonce", self._secret)

    @staticmethod
    def generate() -> Key:
        return Key(secrets.token_bytes(32))

    @staticmethod
    def from_text(text: str, where: str = "the key text") -> Key:
        """A key from 64 hex digits or the base64 of 32 bytes (what ``to_text`` writes)."""
        text = text.strip()
        raw: bytes | None = None
        try:
            raw = bytes.fromhex(text) if len(text) == 64 else base64.b64decode(text,
                                                                                 validate=True)
        except (ValueError, binascii.Error):
            raw = None
        if raw is None or len(raw) != 32:
            raise InvalidArgumentError(
                f"{where} is not a key: expected 64 hex digits or the base64 of 32 bytes "
                "(make one with `cas-checkpoint keygen` or Key.generate().to_text())")
        return Key(raw)

    @staticmethod
    def from_env(name: str = "CAS_KEY") -> Key:
        text = os.environ.get(name)
        if not text:
            raise InvalidArgumentError(f"environment variable {name} is not set; set it to the "
                                       "store's key (base64 or hex text)")
        return Key.from_text(text, f"environment variable {name}")

    @staticmethod
    def from_file(path: str | os.PathLike[str]) -> Key:
        try:
            with open(path, encoding="ascii") as f:
                text = f.read(4096)
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidArgumentError(f"cannot read key file {os.fspath(path)!r}: {exc}"
                                       ) from None
        return Key.from_text(text, f"key file {os.fspath(path)!r}")

    def to_text(self) -> str:
        """The key as base64 text (for ``CAS_KEY`` or a key file): keep it secret."""
        return base64.b64encode(self._secret).decode("ascii")

    def __repr__(self) -> str:
        return f"Key(id={self.id!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and other._secret == self._secret

    def __hash__(self) -> int:
        return hash(self.id)

    # --- sealing ---

    def seal(self, ad: bytes, plain: bytes) -> bytes:
        """nonce + AES-256-GCM(plain, ad); the nonce is a keyed hash of ``ad`` and ``plain``."""
        return b"".join(self.seal_parts(ad, plain))

    def seal_parts(self, ad: bytes, plain: bytes) -> tuple[bytes, bytes]:
        """``seal``'s bytes in two parts (nonce, ciphertext), for a caller that joins them
        with more (a big pack is then copied once, not twice)."""
        threads = blake3.blake3.AUTO if len(plain) >= 1 << 20 else 1  # (the same hash)
        h = blake3.blake3(struct.pack(">Q", len(ad)) + ad, key=self._nonce, max_threads=threads)
        h.update(plain)
        nonce = h.digest(length=_NONCE)
        sealed: bytes = self._aead.encrypt(nonce, plain, ad)
        return nonce, sealed

    def unseal(self, ad: bytes, sealed: bytes | memoryview, path: str) -> bytes:
        from cryptography.exceptions import InvalidTag

        if len(sealed) < _NONCE + _TAG:
            raise BrokenSeal(path)
        view = memoryview(sealed)  # (a big pack is not copied, twice, to be decrypted)
        try:
            out: bytes = self._aead.decrypt(view[:_NONCE], view[_NONCE:], ad)
        except InvalidTag:
            raise BrokenSeal(path) from None
        return out


Provider = Callable[[str], "Key | None"]
Encryption = Key | Sequence[Key] | Provider | str | None
"""What ``open(encryption=...)`` takes: a Key; a list ``[new, old, ...]`` (the first writes,
all read); a provider ``key_id -> Key | None``; ``"keyless"`` (gc and a quick verify only)."""


class Keyring:
    """The keys a store object was opened with."""

    def __init__(self, keys: Sequence[Key] = (), provider: Provider | None = None,
                 keyless: bool = False) -> None:
        self.keys = {k.id: k for k in keys}
        self.writer: Key | None = keys[0] if keys else None
        self.provider = provider
        self.keyless = keyless
        self.recorded: set[str] = set()  # key ids the store records (its creator, keys/ files)
        self._asked: set[str] = set()

    @staticmethod
    def of(encryption: Any) -> Keyring | None:
        if encryption is None:
            return None
        if isinstance(encryption, Key):
            return Keyring([encryption])
        if encryption == KEYLESS:
            return Keyring(keyless=True)
        if isinstance(encryption, list | tuple) and encryption and all(
                isinstance(k, Key) for k in encryption):
            return Keyring(list(encryption))
        if callable(encryption) and not isinstance(encryption, str | bytes):
            return Keyring(provider=encryption)
        raise InvalidArgumentError(
            "encryption must be a Key, a non-empty list of Keys (the first writes), a callable "
            f"key_id -> Key | None, or 'keyless'; not {type(encryption).__name__}. E.g. "
            "encryption=Key.from_env('CAS_KEY')")

    @property
    def ids(self) -> list[str]:
        return list(self.keys)

    def find(self, kid: str) -> Key | None:
        """The key of id ``kid`` if given (a provider is asked once per id)."""
        key = self.keys.get(kid)
        if key is None and self.provider is not None and kid not in self._asked:
            self._asked.add(kid)
            got = self.provider(kid)
            if got is not None:
                if not isinstance(got, Key) or got.id != kid:
                    raise InvalidArgumentError(f"the key provider returned {got!r} for key id "
                                               f"{kid}: return that key, or None")
                self.keys[kid] = key = got
                self.writer = self.writer or got
        return key

    def get(self, kid: str, what: str) -> Key:
        key = self.find(kid)
        if key is None:
            if self.keyless:
                raise InvalidArgumentError(
                    f"{what} is encrypted (key id {kid}) and this store was opened key-less "
                    "(gc and quick verify only); open it with encryption=Key.from_env('CAS_KEY')")
            raise InvalidArgumentError(
                f"{what} is encrypted with key id {kid}, which is not among the keys given "
                f"({', '.join(self.keys) or 'none'}); pass it too, e.g. encryption=[new_key, "
                "old_key], then run rekey to need only the new one")
        return key

    def unseal(self, kid: str, ad_of: Callable[[str], bytes], sealed: bytes | memoryview,
               path: str, what: str) -> bytes:
        """The plain bytes sealed under key id ``kid`` with associated data ``ad_of(kid)``. A
        ``kid`` no given key has is told apart from damage: if a given key opens the bytes
        under its own id, or ``kid`` is a few bits from an id the store uses, the clear id was
        damaged (``DamagedKeyId``); otherwise the key is missing (``InvalidArgumentError``)."""
        key = self.find(kid)
        if key is not None:
            return key.unseal(ad_of(kid), sealed, path)
        for other in list(self.keys.values()):  # (in the error path only: one try per key)
            try:
                other.unseal(ad_of(other.id), sealed, path)
            except BrokenSeal:
                continue
            raise DamagedKeyId(path, kid, other.id, True)
        near = _near(kid, [*self.keys, *sorted(self.recorded)])
        if near is not None:
            raise DamagedKeyId(path, kid, near, False)
        return self.get(kid, what).unseal(ad_of(kid), sealed, path)  # raises: a missing key

    def write_key(self) -> Key:
        if self.writer is None:
            raise InvalidArgumentError(
                "this store was opened without a key to write with (key-less, or a provider "
                "that gave no key yet); open it with encryption=Key.from_env('CAS_KEY')")
        return self.writer


# --- packs ---------------------------------------------------------------------------------


def seal_pack(plain: bytes, key: Key) -> bytes:
    """A pack's stored bytes: clear header (with the key id), then the sealed plain pack."""
    clear = _HEADERS[PACK] + bytes([ENCRYPTED]) + bytes.fromhex(key.id)
    return b"".join((clear, *key.seal_parts(b"pack\0" + clear, plain)))


def is_sealed_pack(data: bytes | memoryview) -> bool:
    return len(data) > 5 and bytes(data[:5]) == _HEADERS[PACK] and data[5] & ENCRYPTED != 0


def open_sealed_pack(data: bytes | memoryview, ring: Keyring, path: str) -> bytes:
    """The plain pack inside a sealed one (IntegrityError if it was changed)."""
    if len(data) < _PACK_CLEAR + _NONCE + _TAG or data[5] != ENCRYPTED:
        raise FormatError(f"{path}: an encrypted pack with a damaged header")
    clear = bytes(data[:_PACK_CLEAR])
    plain = ring.unseal(clear[6:].hex(), lambda kid: b"pack\0" + clear[:6] + bytes.fromhex(kid),
                        data[_PACK_CLEAR:], path, path)
    if is_sealed_pack(plain):
        raise FormatError(f"{path}: an encrypted pack inside an encrypted pack")
    return plain


# --- heads ---------------------------------------------------------------------------------


def seal_head(plain: bytes, key: Key, ref_key: str) -> bytes:
    packs = packs_of(plain, ref_key)
    clear = bytearray(SEALED_HEAD + bytes.fromhex(key.id) + struct.pack(">I", len(packs)))
    for p in packs:
        clear += bytes.fromhex(p.id) + struct.pack(">Q", p.size)
    return bytes(clear) + key.seal(_head_ad(ref_key, bytes(clear)), plain)


def _head_ad(ref_key: str, clear: bytes) -> bytes:
    return b"head\0" + ref_key.encode() + b"\0" + clear


def _clear_part(data: bytes, path: str) -> tuple[str, list[tuple[str, int]], int]:
    """(key id, [(pack id, size)], where the sealed part starts) of a sealed head."""
    if len(data) > MAX_HEAD_BYTES or len(data) < 5 + _ID + 4 or data[:5] != SEALED_HEAD:
        raise FormatError(f"{path} is not an encrypted ref (damaged, or from another store)")
    (n,) = struct.unpack_from(">I", data, 5 + _ID)
    start = 5 + _ID + 4 + 40 * n
    if start + _NONCE + _TAG > len(data):
        raise FormatError(f"{path}: an encrypted ref shorter than its pack list says")
    packs = [(data[i:i + 32].hex(), struct.unpack_from(">Q", data, i + 32)[0])
             for i in range(5 + _ID + 4, start, 40)]
    return data[5:5 + _ID].hex(), packs, start


def open_head(data: bytes, ring: Keyring, ref_key: str) -> bytes:
    """The plain head inside a sealed ref: its own encoding (``Head.decode`` reads it). A
    key-less keyring gets a head that names the ref's packs and nothing else."""
    kid, packs, start = _clear_part(data, ref_key)
    if ring.keyless and kid not in ring.keys:
        return Head(ref_key.rsplit("/", 1)[-1], None,
                    packs=tuple(PackRef(ObjectId(p), 0, s, 0) for p, s in packs)).encode()
    clear = data[:start]
    plain = ring.unseal(kid, lambda k: _head_ad(ref_key, clear[:5] + bytes.fromhex(k)
                                                + clear[5 + _ID:]),
                        data[start:], ref_key, f"ref {ref_key}")
    if [(p.id, p.size) for p in Head.decode(plain, ref_key).packs] != packs:
        raise FormatError(f"ref {ref_key}: its clear pack list is not the one sealed inside")
    return plain


def is_sealed_key(key: str) -> bool:
    """Whether a key names a thread by ``e-`` and a keyed hash (64 hex digits)."""
    name = key.rsplit("/", 1)[-1]
    return (len(name) == 66 and name.startswith("e-")
            and all(c in "0123456789abcdef" for c in name[2:]))


class SealedBackend(Backend):
    """A backend whose thread refs are renamed (``e-`` + a keyed hash of their plain name) and
    sealed on the way to storage; everything else passes through. ``names`` is the store's
    names secret (None until ``opening`` read it, and for a key-less store). It does not
    expose the storage's own attributes (``fs``...): code that would open a second backend
    from them would bypass the sealing; ``inner`` is the storage, for those who mean it."""

    def __init__(self, inner: Backend, ring: Keyring) -> None:
        self.inner = inner
        self.ring = ring
        self.names: bytes | None = None
        self.concurrency = inner.concurrency
        self.url = inner.url
        self.has_folders = inner.has_folders

    def prepare_folders(self, folders: Iterable[str]) -> None:
        self.inner.prepare_folders(folders)  # (packs keep their keys)

    def ref_key(self, key: str) -> str:
        """The stored key of a thread's ref (its plain key as ``refs.thread_key`` spells it)."""
        if not key.startswith(HEADS + "/") or is_sealed_key(key):
            return key
        if self.names is None:
            raise InvalidArgumentError(
                f"{self.url} is encrypted and was opened key-less: only gc and verify("
                "deep=False) work; open it with encryption=Key.from_env('CAS_KEY')")
        name = key[len(HEADS) + 1:]
        return f"{HEADS}/e-" + blake3.blake3(name.encode(), key=self.names).hexdigest()

    def _out(self, key: str, got: tuple[bytes, str] | None) -> tuple[bytes, str] | None:
        if got is None or not key.startswith(HEADS + "/"):
            return got
        return open_head(got[0], self.ring, key), got[1]

    def _in(self, key: str, data: bytes) -> bytes:
        if not key.startswith(HEADS + "/"):
            return data
        return seal_head(data, self.ring.write_key(), key)

    # --- the primitives ---

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        return self.inner.get_many(keys)

    def put_many(self, items: dict[str, bytes]) -> None:
        self.inner.put_many(items)

    def read_ref(self, key: str) -> tuple[bytes, str] | None:
        key = self.ref_key(key)
        return self._out(key, self.inner.read_ref(key))

    def read_refs(self, keys: builtins.list[str]) -> builtins.list[tuple[bytes, str] | None]:
        keys = [self.ref_key(k) for k in keys]
        return [self._out(k, g) for k, g in zip(keys, self.inner.read_refs(keys), strict=True)]

    def write_ref(self, key: str, data: bytes, expected: str | None,
                  refresh: Callable[[], None] | None = None) -> str:
        key = self.ref_key(key)
        return self.inner.write_ref(key, self._in(key, data), expected, refresh)

    def delete_ref(self, key: str, expected: str) -> None:
        self.ring.write_key()
        self.inner.delete_ref(self.ref_key(key), expected)

    def list(self, prefix: str) -> builtins.list[ObjectInfo]:
        return self.inner.list(prefix)

    def delete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        return self.inner.delete_many(keys)

    def list_many(self, prefixes: Iterable[str]) -> Iterable[ObjectInfo]:
        return self.inner.list_many(prefixes)

    async def run_blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self.inner.run_blocking(fn, *args)

    async def aget_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        return await self.inner.aget_many(keys)

    async def aput_many(self, items: dict[str, bytes]) -> None:
        await self.inner.aput_many(items)

    async def aread_ref(self, key: str) -> tuple[bytes, str] | None:
        key = self.ref_key(key)
        return self._out(key, await self.inner.aread_ref(key))

    async def aread_refs(self, keys: builtins.list[str]) -> builtins.list[tuple[bytes, str] | None]:
        keys = [self.ref_key(k) for k in keys]
        got = await self.inner.aread_refs(keys)
        return [self._out(k, g) for k, g in zip(keys, got, strict=True)]

    async def awrite_ref(self, key: str, data: bytes, expected: str | None,
                         refresh: Callable[[], None] | None = None) -> str:
        key = self.ref_key(key)
        return await self.inner.awrite_ref(key, self._in(key, data), expected, refresh)

    async def adelete_ref(self, key: str, expected: str) -> None:
        self.ring.write_key()
        await self.inner.adelete_ref(self.ref_key(key), expected)

    async def alist(self, prefix: str) -> builtins.list[ObjectInfo]:
        return await self.inner.alist(prefix)

    async def alist_many(self, prefixes: Iterable[str]) -> builtins.list[ObjectInfo]:
        return await self.inner.alist_many(prefixes)

    async def adelete_many(self, keys: Iterable[str]) -> builtins.list[str]:
        return await self.inner.adelete_many(keys)

    async def aclose(self) -> None:
        await self.inner.aclose()


def unwrap(backend: Backend) -> Backend:
    """The storage backend under a ``SealedBackend`` (itself otherwise)."""
    return backend.inner if isinstance(backend, SealedBackend) else backend


# --- the names secret, and opening ---------------------------------------------------------


def key_file(kid: str) -> str:
    return f"{KEYS}/{kid}"


def wrap(key: Key, names: bytes) -> bytes:
    return SEALED_HEAD[:3] + b"K" + bytes([VERSION]) + key.seal(b"names\0" + key.id.encode(),
                                                                names)


def unwrap_names(key: Key, data: bytes, path: str) -> bytes:
    if data[:5] != SEALED_HEAD[:3] + b"K" + bytes([VERSION]):
        raise FormatError(f"{path} is not a wrapped key (damaged, or from a newer version)")
    names = key.unseal(b"names\0" + key.id.encode(), data[5:], path)
    if len(names) != 32:
        raise FormatError(f"{path} holds a names secret of the wrong length")
    return names


def opening(url: str, objects: Any, backend: SealedBackend, create: bool) -> Step[None]:
    """``open`` with ``encryption=``: the store is encrypted (created so if it is new, with a
    fresh names secret wrapped under the writing key inside ``cas-store``), and one of the keys
    given opens its names secret."""
    ring = backend.ring
    got = yield GetMany([marker.MARKER] + [key_file(k) for k in ring.ids])
    have = None if got.get(marker.MARKER) is None else marker.Settings.decode(
        got[marker.MARKER] or b"")
    if have is None:
        if (yield from marker.present()):
            raise InvalidArgumentError(
                f"the store at {url!r} is not encrypted (it was written without a key); open "
                "it without encryption=, or copy its threads into a new encrypted store")
        if not create:
            raise marker.absent(url)
        writer = ring.write_key()
        wanted = objects.wanted or marker.DEFAULT
        names = secrets.token_bytes(32)
        made = marker.Settings(wanted.compression, wanted.level, CIPHER, writer.id,
                               wrap(writer, names))
        yield PutMany({marker.MARKER: made.encode()})  # create-if-absent: one creator wins
        got = yield GetMany([marker.MARKER] + [key_file(k) for k in ring.ids])
        have = marker.Settings.decode(got[marker.MARKER] or b"")
    if have.encryption is None:
        raise InvalidArgumentError(
            f"the store at {url!r} is not encrypted; open it without encryption= (a store keeps "
            "the settings it was created with)")
    objects.keyring = ring
    ring.recorded.update([have.key_id] if have.key_id else [])
    ring.recorded.update(k.rsplit("/", 1)[-1] for k, v in got.items()
                         if k.startswith(KEYS + "/") and v)
    if not ring.keyless:
        backend.names = yield from _names(url, ring, have, got)
    if objects.wanted is not None:
        yield from objects.settle()


def _names(url: str, ring: Keyring, have: marker.Settings,
           got: dict[str, bytes | None]) -> Step[bytes]:
    """The names secret, unwrapped by the first key given that the store knows."""
    wrapped = dict((k, v) for k, v in got.items() if k.startswith(KEYS + "/") and v)
    if have.key_id is not None and have.names is not None:
        wrapped.setdefault(key_file(have.key_id), have.names)
    for kid in ring.ids:
        if key_file(kid) in wrapped:
            return unwrap_names(ring.keys[kid], wrapped[key_file(kid)], key_file(kid))
    known = [have.key_id] if have.key_id else []
    known += [i.key.rsplit("/", 1)[-1] for i in (yield List(KEYS))]
    ring.recorded.update(known)
    if ring.provider is not None:
        for kid in dict.fromkeys(known):
            if ring.find(kid) is None:
                continue
            if key_file(kid) not in wrapped:
                wrapped.update((yield GetMany([key_file(kid)])))
            data = wrapped.get(key_file(kid))
            if data is not None:
                return unwrap_names(ring.keys[kid], data, key_file(kid))
    raise InvalidArgumentError(
        f"none of the keys given (key ids {', '.join(ring.ids) or 'none'}) opens the store at "
        f"{url!r}, which knows key ids {', '.join(dict.fromkeys(known))}: a wrong key? While "
        "rotating, pass encryption=[new_key, old_key]")


def record_writer(ring: Keyring, have: marker.Settings, names: bytes | None) -> Step[None]:
    """Before a first write: the writing key's names-secret file (so the key alone opens the
    store later), unless the store already has it."""
    writer = ring.writer
    if writer is None or names is None or writer.id == have.key_id:
        return
    path = key_file(writer.id)
    got = yield GetMany([path])
    if got.get(path) is None:
        yield PutMany({path: wrap(writer, names)})


__all__ = ["CIPHER", "KEYLESS", "BrokenSeal", "DamagedKeyId", "Encryption", "Key", "Keyring",
           "SealedBackend", "is_sealed_key", "unwrap"]
