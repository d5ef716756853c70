"""Sealing, pure: keys, sealed packs and heads, and the wrapped names secret (client-side
encryption that keeps deduplication).
Rule: an encrypted store shows no content, thread id, label or metadata to its storage."""

from __future__ import annotations

import base64
import binascii
import os
import secrets
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import blake3

from cas_checkpoint.errors import FormatError, IntegrityError, InvalidArgumentError
from cas_checkpoint.format.heads import MAX_HEAD_BYTES, Head, PackRef, packs_of
from cas_checkpoint.format.objects import _HEADERS, PACK, VERSION, ObjectId
from cas_checkpoint.format.pack import ENCRYPTED

CIPHER = "aes-256-gcm/blake3-siv"  # the one cipher suite, as the store's settings name it
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


# --- the names secret ---------------------------------------------------------


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


