"""State <-> state nodes. A state is stored as a tree of content-addressed nodes; the root's
id goes into the checkpoint record. Pure code apart from the ``fetch`` callback."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import codec
from .objects import ObjectId, decode_node, encode_node, object_id


@dataclass(frozen=True, slots=True)
class Built:
    root: ObjectId
    objects: dict[ObjectId, bytes]  # every node of the tree, root included
    size: int  # encoded bytes of the state


def build(value: Any, types: codec.TypeRegistry | None = None) -> Built:
    """Encode a state into nodes (SerializationError before anything is written)."""
    payload = codec.encode(value, types=types)
    data = encode_node(payload)
    root = object_id(data)
    return Built(root, {root: data}, len(payload))


def load(root: ObjectId, fetch: Callable[[list[ObjectId]], Mapping[str, bytes]],
         types: codec.TypeRegistry | None = None) -> Any:
    """Read a state back from its root node; ``fetch`` returns verified bytes by id."""
    return load_node(fetch([root])[root], fetch, types)


def load_node(data: bytes, fetch: Callable[[list[ObjectId]], Mapping[str, bytes]],
              types: codec.TypeRegistry | None) -> Any:
    children, payload = decode_node(data)
    if not children:
        return codec.decode(payload, types=types)
    got = fetch(list(children))
    loaded = [load_node(got[c], fetch, types) for c in children]
    return codec.decode(payload, types=types, resolve=lambda i: _pick(loaded, i))


def _pick(loaded: list[Any], index: int) -> Any:
    from .errors import FormatError

    if not 0 <= index < len(loaded):
        raise FormatError(f"node refers to child {index} of {len(loaded)}; the node is corrupt")
    return loaded[index]
