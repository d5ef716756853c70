"""The store's root object, ``cas-store``: it marks a root as a store and holds the settings the
store was created with.
Rule: written once, create-if-absent; read-only openers never create it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from cas_checkpoint.engine.steps import GetMany, List, Op, PutMany, Step
from cas_checkpoint.errors import FormatError, InvalidArgumentError, NotFoundError, StorageError
from cas_checkpoint.format.objects import VERSION
from cas_checkpoint.format.pack import Zstd, compressor
from cas_checkpoint.format.sealing import CIPHER

MARKER = "cas-store"
MAX_CONFIG = 4096  # bytes; a bigger one is refused unread


@dataclass(frozen=True, slots=True)
class Settings:
    compression: str | None = None  # None or "zstd"
    level: int | None = None
    encryption: str | None = None  # None or crypto.CIPHER
    key_id: str | None = None  # the key the store was created with (an id, never the key)
    names: bytes | None = None  # the names secret, sealed under that key (sealing.py)

    @staticmethod
    def of(compression: Any, level: Any) -> Settings | None:
        """The settings a caller asked for (None: whatever the store has), checked."""
        if compression is None and level is None:
            return None
        if compression == "none" and level is not None:
            raise InvalidArgumentError(
                f"compression_level={level!r} needs compression='zstd' (a store with "
                "compression='none' has no level)")
        # a level alone asks for the default compression at that level (it used to make a
        # plain store, dropping the level without a word)
        name = (DEFAULT.compression if compression is None
                else None if compression == "none" else compression)
        try:
            made = compressor(name, level)
        except ValueError as exc:
            raise InvalidArgumentError(f"{exc}; e.g. compression='zstd', compression_level=3"
                                       ) from None
        return Settings(name, made.level if made else None)

    def compressor(self) -> Zstd | None:
        return compressor(self.compression, self.level)

    def encode(self) -> bytes:
        body: dict[str, Any] = {"cas_checkpoint": VERSION, "compression": self.compression,
                                "level": self.level}
        if self.encryption is not None:  # a plain store's object is as it always was
            body.update(encryption=self.encryption, key_id=self.key_id, names=self.names)
        out: bytes = msgpack.packb(body, use_bin_type=True)
        return out

    def same_compression(self, other: Settings) -> bool:
        return (self.compression, self.level) == (other.compression, other.level)

    @staticmethod
    def decode(data: bytes) -> Settings:
        bad = FormatError(f"the store's {MARKER} object is damaged or from a newer "
                          "cas_checkpoint (upgrade, or run `cas-checkpoint verify`)")
        if len(data) > MAX_CONFIG:
            raise bad
        try:
            body = msgpack.unpackb(data, strict_map_key=True, max_str_len=256,
                                   max_array_len=64, max_map_len=64)
        except Exception:  # noqa: BLE001 - any undecodable bytes
            raise bad from None
        if not isinstance(body, dict) or not isinstance(body.get("cas_checkpoint"), int):
            raise bad
        if not set(body) <= {"cas_checkpoint", "compression", "level", "encryption", "key_id",
                             "names"}:
            raise bad  # a setting this version does not know: writing could mix stores
        try:
            made = compressor(body.get("compression"), body.get("level"))
        except ValueError:
            raise bad from None
        enc, kid, names = body.get("encryption"), body.get("key_id"), body.get("names")
        if enc is not None and (enc != ENCRYPTION or not isinstance(kid, str)
                                or not isinstance(names, bytes)):
            raise bad
        return Settings(body.get("compression"), made.level if made else None, enc,
                        kid if enc else None, names if enc else None)

    def describe(self) -> str:
        return "no compression" if self.compression is None else \
            f"compression={self.compression!r}, compression_level={self.level}"


ENCRYPTION = CIPHER  # the one cipher suite (format.sealing)
DEFAULT = Settings("zstd", 3)  # what a new store is created with (compression="none": plain)


def present(marker_read: bool = False) -> Step[bool]:
    """True if the root holds a store: its marker, or any ref or pack (stores written before the
    marker existed, or by a first save). ``marker_read``: the caller found no marker already."""
    if not marker_read:
        got = yield GetMany([MARKER])
        if got.get(MARKER) is not None:
            return True
    for prefix in ("refs", "packs"):
        if (yield List(prefix)):
            return True
    return False


def read() -> Step[Settings | None]:
    got = yield GetMany([MARKER])
    data = got.get(MARKER)
    return None if data is None else Settings.decode(data)


def settle(url: str, wanted: Settings | None, *, write: bool = True,
           skeleton: Op | None = None) -> Step[Settings]:
    """The settings to write with: the store's own; ``wanted`` (if given) must agree with them.
    A store without settings takes ``wanted``, or else ``DEFAULT`` (also a store written
    before settings existed). With ``write`` they are written (create-if-absent, then read
    back: a concurrent opener may have won); without, this only says what a write would use.
    ``skeleton``: a request made just before the settings are written (the store's folders,
    made with its root object; see ``ObjectStore._settings``)."""
    have = yield from read()
    if have is None:
        chosen = wanted or DEFAULT  # (a store from before settings gets them too: a reader
        # older than them refuses its compressed packs by name, "upgrade cas_checkpoint")
        if not write:
            return chosen
        if skeleton is not None:
            yield skeleton
        yield PutMany({MARKER: chosen.encode()})
        have = yield from read()  # a concurrent first writer's, if it won: the store's now
        if have is None:
            raise StorageError(f"the store at {url!r} did not keep its settings object "
                               f"{MARKER!r} (written, then not found): check the storage")
    if wanted is not None and not wanted.same_compression(have):
        raise InvalidArgumentError(
            f"the store at {url!r} was created with {have.describe()}; it was opened with "
            f"{wanted.describe()}. Open it without compression= to use its own settings")
    return have


def encrypted(url: str, have: Settings) -> InvalidArgumentError:
    """The error for an encrypted store opened without a key."""
    return InvalidArgumentError(
        f"the store at {url!r} is encrypted (key id {have.key_id}); pass "
        "encryption=Key.from_env('CAS_KEY') (or encryption='keyless' for gc and a quick "
        "verify)")


def refuse_encrypted(url: str) -> Step[None]:
    """InvalidArgumentError if the store at ``url`` (opened without a key) is encrypted."""
    have = yield from read()
    if have is not None and have.encryption is not None:
        raise encrypted(url, have)


def opening(url: str, objects: Any, create: bool) -> Step[None]:
    """What ``open`` checks (without ``encryption=``; with it, ``crypto.opening``). A plain
    ``open`` makes no request. With ``create=False`` or explicit settings (``objects.wanted``)
    it reads the root object: the store is not encrypted; with ``create=False`` a store is
    there; explicit settings are the store's (written if it has none)."""
    if create and objects.wanted is None:
        return  # no request: a first write reads the settings (and refuses an encrypted
        # store); a read of an encrypted store meets a sealed ref (Head.decode says so)
    try:
        have = yield from read()
    except StorageError:
        if not create:
            raise
        have = None  # unreachable now: the first operation says so (a write re-reads this)
    if have is not None and have.encryption is not None:
        raise encrypted(url, have)
    if not create and have is None and not (yield from present(marker_read=True)):
        raise absent(url)
    if objects.wanted is not None:
        yield from objects.settle()


def absent(url: str) -> NotFoundError:
    return NotFoundError(f"no store at {url!r}: it holds no checkpoints; check the URL, or "
                         "create one with `cas-checkpoint init` (or a first save)")
