"""Fuzz the decoders of everything read from storage (heads, records, segments, nodes, packs, and
the joining of a state from nodes): whatever the bytes, only a CasError comes out, within bounded
memory and time. The fuzzing runs in a subprocess with an address-space limit (RLIMIT_AS), so a
crash or a huge allocation fails this test instead of the run. CAS_FUZZ_EXAMPLES sets the size
(CI runs a few hundred examples per target; `CAS_FUZZ_EXAMPLES=20000` for a long run)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cas_checkpoint.format import decoding

EXAMPLES = int(os.environ.get("CAS_FUZZ_EXAMPLES", "300"))
MEMORY_LIMIT = 1 << 30  # bytes of address space for the fuzzing process

_FUZZ = r"""
import os, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]), int(sys.argv[2])))
import msgpack
from hypothesis import HealthCheck, given, settings, strategies as st
from cas_checkpoint import CasError
from cas_checkpoint.format import codec, decoding
from cas_checkpoint.tree import load as join, build as tree
if sys.argv[3] == "msgpack":
    decoding.FAST_UNPACKB = None
else:  # ormsgpack tried first on inputs of any size (decoding.py)
    assert decoding.FAST_UNPACKB is not None
    decoding.FAST_MIN = 0
from cas_checkpoint.format.objects import (
    LogEntry, Record, Segment, decode_node, encode_node, object_id,
)
from cas_checkpoint.format.heads import Head, PackRef, Peak
from cas_checkpoint.format.pack import decode_pack, encode_pack
from cas_checkpoint.engine.object_store import parse_pack

N = int(sys.argv[1])

def seeds():
    state = {"messages": [{"role": "user", "content": "m%d " % i * 40} for i in range(60)],
             "t": (1, 2.5, None), "s": {1, 2}}
    built = tree.build(state)
    entry = LogEntry("ab" * 32, ("cd" * 32,), 3, 1.5, 10, "l", ("t",), {"k": 1})
    head = Head("thread", "ab" * 32, 3, (Peak("ef" * 32, 0, 16),), (entry,),
                (PackRef("12" * 32, 1, 100, 3),), (b"CASN\x03\x00\x00\xc0",), b"12345678")
    rec = Record("thread", ("cd" * 32,), built.root, 3, 1.5, 10, "l", ("t",), {"k": 1})
    seg = Segment(0, entries=(entry,) * 3)
    pack = encode_pack(dict(list(built.objects.items())[:8]))
    upper = Segment(1, children=("ab" * 32,)).encode()
    return built, [head.encode(), rec.encode(), seg.encode(), upper, pack,
                   *list(built.objects.values())[:6]]

BUILT, SEEDS = seeds()

def mutate(data, edits):
    out = bytearray(data)
    for pos, value, kind in edits:
        if not out:
            out.append(value)
            continue
        pos %= len(out)
        if kind == 0:
            out[pos] = value
        elif kind == 1:
            del out[pos:pos + value % 8 + 1]
        elif kind == 2:
            out[pos:pos] = bytes([value]) * (value % 5 + 1)
        else:
            out = out[:pos]
    return bytes(out)

edits = st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255), st.integers(0, 3)),
                 max_size=6)
blobs = st.one_of(st.binary(max_size=300),
                  st.builds(mutate, st.sampled_from(SEEDS), edits))

def decoders(data):
    yield lambda: Head.decode(data)
    yield lambda: Record.decode(data)
    yield lambda: Segment.decode(data)
    yield lambda: decode_node(data)
    yield lambda: decode_pack(data)
    yield lambda: parse_pack(object_id(data), data)
    yield lambda: codec.decode(data)

@settings(max_examples=N, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(blobs)
def fuzz_decoders(data):
    for call in decoders(data):
        try:
            call()
        except CasError:
            pass

@settings(max_examples=N, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(st.sampled_from(sorted(BUILT.objects)), edits, st.integers(0, 400))
def fuzz_join(victim, edit, dup):
    # one node of a real tree replaced by a mutation of itself (names kept: a hostile store),
    # then the state joined from the root
    nodes = dict(BUILT.objects)
    nodes[victim] = mutate(nodes[victim], edit)
    def fetch(ids):
        out = {}
        for i in ids:
            if i not in nodes:
                raise CasError("missing " + i)
            out[i] = nodes[i]
        return out
    try:
        join.load(BUILT.root, fetch)
    except CasError:
        pass

@settings(max_examples=max(20, N // 10), deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(st.integers(1, 3000), st.integers(1, 3000), st.integers(1, 70000))
def fuzz_fanout(a, b, size):
    # a leaf named a times by a node named b times: a DAG that explodes when expanded
    bld = tree._Builder(None)
    leaf = bld.node(tree.VALUE, codec.encode("x" * size))
    def fan(child, n):
        links = b"".join(codec.encode_link(codec.Ref(i)) for i in range(n))
        hdr = msgpack.Packer().pack_array_header(n)
        return bld.node(tree.VALUE, hdr + links, [child] * n)
    top = fan(fan(leaf, a), b)
    try:
        join.load(top, lambda ids: {i: bld.objects[i] for i in ids})
    except CasError:
        pass

fuzz_decoders()
fuzz_join()
fuzz_fanout()
print("ok")
"""


@pytest.mark.parametrize("decoder", ["msgpack", "ormsgpack"])
def test_decoders_raise_only_cas_errors_within_bounded_memory(decoder: str) -> None:
    if decoder == "ormsgpack" and decoding._accelerator() is None:
        pytest.skip("ormsgpack is not installed")
    proc = subprocess.run([sys.executable, "-c", _FUZZ, str(EXAMPLES), str(MEMORY_LIMIT),
                           decoder], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), (
        proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
