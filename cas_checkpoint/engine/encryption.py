"""Opening an encrypted store: its settings say it is encrypted (created so, with a fresh
names secret wrapped under the writing key), and one of the keys given opens its names secret.
The keys and seals are ``format.sealing``; the storage wrapper ``backends.sealed``."""

from __future__ import annotations

import secrets
from typing import Any

from cas_checkpoint.backends.sealed import SealedBackend
from cas_checkpoint.engine import settings
from cas_checkpoint.engine.steps import GetMany, List, PutMany, Step
from cas_checkpoint.errors import InvalidArgumentError
from cas_checkpoint.format.sealing import CIPHER, KEYS, Keyring, key_file, unwrap_names, wrap


def opening(url: str, objects: Any, backend: SealedBackend, create: bool) -> Step[None]:
    """``open`` with ``encryption=``: the store is encrypted (created so if it is new, with a
    fresh names secret wrapped under the writing key inside ``cas-store``), and one of the keys
    given opens its names secret."""
    ring = backend.ring
    got = yield GetMany([settings.MARKER] + [key_file(k) for k in ring.ids])
    have = None if got.get(settings.MARKER) is None else settings.Settings.decode(
        got[settings.MARKER] or b"")
    if have is None:
        if (yield from settings.present()):
            raise InvalidArgumentError(
                f"the store at {url!r} is not encrypted (it was written without a key); open "
                "it without encryption=, or copy its threads into a new encrypted store")
        if not create:
            raise settings.absent(url)
        writer = ring.write_key()
        wanted = objects.wanted or settings.DEFAULT
        names = secrets.token_bytes(32)
        made = settings.Settings(wanted.compression, wanted.level, CIPHER, writer.id,
                               wrap(writer, names))
        yield PutMany({settings.MARKER: made.encode()})  # create-if-absent: one creator wins
        got = yield GetMany([settings.MARKER] + [key_file(k) for k in ring.ids])
        have = settings.Settings.decode(got[settings.MARKER] or b"")
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


def _names(url: str, ring: Keyring, have: settings.Settings,
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


def record_writer(ring: Keyring, have: settings.Settings, names: bytes | None) -> Step[None]:
    """Before a first write: the writing key's names-secret file (so the key alone opens the
    store later), unless the store already has it."""
    writer = ring.writer
    if writer is None or names is None or writer.id == have.key_id:
        return
    path = key_file(writer.id)
    got = yield GetMany([path])
    if got.get(path) is None:
        yield PutMany({path: wrap(writer, names)})



