"""cas_checkpoint.format.codec: exact round trips, determinism, error paths and hostile bytes."""

from __future__ import annotations

import collections
import dataclasses
import enum
import math
import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta, timezone, tzinfo
from datetime import time as dtime
from decimal import Decimal
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cas_checkpoint.errors import FormatError, InvalidArgumentError, SerializationError
from cas_checkpoint.format import codec, decoding
from cas_checkpoint.format.codec import (
    MAX_EXT_DEPTH,
    Ref,
    Span,
    TypeRegistry,
    decode,
    encode,
    encode_link,
)

HAS_ORMSGPACK = decoding._accelerator() is not None


@pytest.fixture(autouse=True, params=["msgpack", "ormsgpack"])
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs with each decoder: msgpack alone, and ormsgpack first on inputs of
    any size (decoding.py: it falls back to msgpack wherever it might differ)."""
    if request.param == "msgpack":
        monkeypatch.setattr(decoding, "FAST_UNPACKB", None)
    elif not HAS_ORMSGPACK:
        pytest.skip("ormsgpack is not installed")
    else:
        monkeypatch.setattr(decoding, "FAST_UNPACKB", decoding._accelerator())
        monkeypatch.setattr(decoding, "FAST_MIN", 0)
    return str(request.param)


PARIS = ZoneInfo("Europe/Paris")
IST = timezone(timedelta(hours=5, minutes=30), "IST")


@dataclasses.dataclass
class Point:
    x: int
    y: Any = None


@dataclasses.dataclass(frozen=True, slots=True)
class Frozen:
    name: str
    tags: tuple[str, ...] = ()
    derived: int = dataclasses.field(init=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "derived", len(self.name))


class Color(enum.Enum):
    RED = "red"
    BLUE = (1, 2)


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Unregistered(enum.Enum):
    A = 1


class Pair(NamedTuple):
    a: int
    b: int


REG = TypeRegistry([Point, Frozen, Color, Level])


# --------------------------------------------------------------------------- helpers


def same(a: Any, b: Any) -> bool:
    """Equal, with the same types all the way down (NaN equals NaN, -0.0 differs from 0.0)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if type(a) is Decimal:
        return str(a) == str(b)
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(map(same, a, b))
    if type(a) is dict:
        return len(a) == len(b) and all(
            same(k1, k2) and same(v1, v2)
            for (k1, v1), (k2, v2) in zip(a.items(), b.items(), strict=True)
        )
    if type(a) in (set, frozenset):
        rest = list(b)
        for x in a:
            match = next((i for i, y in enumerate(rest) if same(x, y)), None)
            if match is None:
                return False
            del rest[match]
        return not rest
    if type(a) in (datetime, dtime):
        return (a.replace(tzinfo=None) == b.replace(tzinfo=None) and a.fold == b.fold
                and type(a.tzinfo) is type(b.tzinfo) and repr(a.tzinfo) == repr(b.tzinfo))
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if hasattr(type(a), "model_fields"):
        return all(same(getattr(a, f), getattr(b, f)) for f in type(a).model_fields)
    return bool(a == b)


def roundtrip(value: Any, types: TypeRegistry | None = REG) -> Any:
    data = encode(value, types=types)
    back = decode(data, types=types)
    assert same(back, value), (value, back)
    assert encode(back, types=types) == data
    return back


def test_same_helper_can_fail() -> None:
    assert not same((1,), [1])
    assert not same(0.0, -0.0)
    assert not same({1: 2, 3: 4}, {3: 4, 1: 2})
    assert not same(Decimal("1.0"), Decimal("1.00"))
    assert not same(datetime(2021, 1, 1, fold=1), datetime(2021, 1, 1))
    assert not same(datetime(2021, 1, 1, tzinfo=IST),
                    datetime(2021, 1, 1, tzinfo=timezone(timedelta(hours=5, minutes=30))))
    assert not same({1}, {1.0})
    assert same(float("nan"), float("nan"))


# --------------------------------------------------------------------------- round trips

EXAMPLES: list[Any] = [
    None, True, False, 0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 2**64, -(2**63) - 1,
    2**200, -(2**200), 2**8000, 1.5, -0.0, float("inf"), float("-inf"), float("nan"), 1e-310,
    "", "héllo \U0001f600", b"", b"\x00\xff", [], [1, [2, [3]]], (), (1,), (1, (2, (3,))),
    {}, {"a": 1}, {(1, "a"): "tuple key", 1: "int", None: "none", frozenset({1, 2}): "fs",
                  (1, (2, 3)): [(), ()], 2.5: b"", False: True},
    set(), {1, 2, 3}, {(1, 2), (3, 4)}, {"a", ("b", frozenset({"c"}))}, frozenset(),
    frozenset({frozenset({1}), frozenset()}),
    datetime(2021, 10, 31, 2, 30, tzinfo=PARIS, fold=1),
    datetime(2021, 10, 31, 2, 30, tzinfo=PARIS, fold=0),
    datetime(2020, 1, 1, 12, 0, 0, 123456, tzinfo=IST),
    datetime(2020, 1, 1, tzinfo=UTC), datetime(2020, 1, 1, tzinfo=timezone(timedelta(0))),
    datetime(2020, 1, 1, tzinfo=timezone(timedelta(hours=-3, microseconds=7))),
    datetime(1, 1, 1), datetime(9999, 12, 31, 23, 59, 59, 999999, fold=1),
    date(2020, 2, 29), dtime(23, 59, 59, 999999, fold=1), dtime(1, 2, tzinfo=IST),
    dtime(1, 2, tzinfo=ZoneInfo("America/New_York")), timedelta(days=-1, microseconds=1),
    timedelta.max, timedelta.min, uuid.UUID(int=0), uuid.uuid4(),
    Decimal("NaN"), Decimal("-NaN"), Decimal("NaN123"), Decimal("sNaN"), Decimal("Infinity"),
    Decimal("-Infinity"), Decimal("-0"), Decimal("1.50"), Decimal("1E+999999"), Decimal("-1.2E-7"),
    Point(1, [Point(2)]), Frozen("ab", ("x",)), Color.RED, Color.BLUE, Level.HIGH,
    {"state": [Point(1, {Color.RED: (1, Level.LOW)})], "when": {date(2020, 1, 1)}},
]


@pytest.mark.parametrize("value", EXAMPLES, ids=lambda v: type(v).__name__)
def test_roundtrip_exact(value: Any) -> None:
    roundtrip(value)


def test_roundtrip_nested_details() -> None:
    back = roundtrip({("k", 1): {(1, 2), (3, 4)}, "t": [(1, (2, [3]))]})
    key = next(iter(back))
    assert type(key) is tuple and type(back[key]) is set
    assert all(type(x) is tuple for x in back[key])
    inner = back["t"][0]
    assert type(inner) is tuple and type(inner[1]) is tuple and type(inner[1][1]) is list

    dt = roundtrip(datetime(2021, 10, 31, 2, 30, tzinfo=PARIS, fold=1))
    assert dt.fold == 1 and dt.tzinfo is PARIS and dt.utcoffset() == timedelta(hours=1)
    assert roundtrip(datetime(2021, 10, 31, 2, 30, tzinfo=PARIS)).utcoffset() == timedelta(hours=2)
    ist = roundtrip(datetime(2020, 1, 1, tzinfo=IST))
    assert ist.tzname() == "IST" and ist.utcoffset() == timedelta(hours=5, minutes=30)
    assert roundtrip(datetime(2020, 1, 1, tzinfo=UTC)).tzinfo is UTC
    assert roundtrip(Decimal("sNaN")).is_snan()
    assert roundtrip(2**200) == 2**200 and roundtrip(-(2**200)) == -(2**200)
    frozen = roundtrip(Frozen("abc"))
    assert frozen.derived == 3
    assert roundtrip(Level.HIGH) is Level.HIGH and roundtrip(Color.BLUE) is Color.BLUE


def test_bytearray_is_stored_as_bytes() -> None:
    # msgpack's C packer writes an exact bytearray as bin without calling our hook.
    assert decode(encode(bytearray(b"ab"))) == b"ab"
    assert type(decode(encode([bytearray(b"ab")]))[0]) is bytes


def test_ints_use_native_msgpack_up_to_64_bits() -> None:
    assert encode(2**64 - 1) == msgpack.packb(2**64 - 1)
    assert encode(-(2**63)) == msgpack.packb(-(2**63))
    assert encode(2**64)[:3] == b"\xc7\x09\x01"  # ext8, 9 bytes, code 1
    assert encode(-(2**63) - 1) == b"\xc7\x09\x01\xff" + b"\x7f" + b"\xff" * 7
    assert encode(1.0) == b"\xcb" + struct.pack(">d", 1.0)
    assert encode(-0.0) == b"\xcb" + struct.pack(">d", -0.0)


def test_plain_values_are_plain_msgpack() -> None:
    state = {"messages": [{"role": "user", "content": "hi", "n": 1, "x": 0.5, "b": b"\x00"}],
             "ok": True, "none": None}
    assert encode(state) == msgpack.packb(state)
    assert decode(msgpack.packb(state)) == state


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(2**300), 2**300),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=10), st.binary(max_size=10),
    st.datetimes(timezones=st.sampled_from([None, UTC, IST, PARIS, ZoneInfo("UTC"),
                                            timezone(timedelta(hours=-9, seconds=1))])).flatmap(
        lambda d: st.sampled_from([d, d.replace(fold=1)])),
    st.dates(), st.times(timezones=st.sampled_from([None, IST, UTC])),
    st.timedeltas(), st.uuids(), st.sampled_from(list(Color) + list(Level)),
)
decimals = st.decimals(allow_nan=True, allow_infinity=True)
hashables = st.recursive(
    st.one_of(scalars, st.decimals(allow_nan=False)),
    lambda inner: st.one_of(st.lists(inner, max_size=3).map(tuple),
                            st.frozensets(inner, max_size=3)),
    max_leaves=8,
)
values = st.recursive(
    st.one_of(scalars, decimals),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(hashables, inner, max_size=4),
        st.sets(hashables, max_size=4),
        st.frozensets(hashables, max_size=4),
        st.builds(Point, inner, inner),
        st.builds(Frozen, st.text(max_size=5), st.lists(st.text(max_size=3)).map(tuple)),
    ),
    max_leaves=20,
)


@given(values)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_roundtrip_property(value: Any) -> None:
    roundtrip(value)


# --------------------------------------------------------------------------- determinism


def test_sets_are_sorted_and_dict_order_matters() -> None:
    items = [f"item-{i}" for i in range(50)] + [(1, 2), 3, 2.5, None]
    assert encode(set(items)) == encode(set(reversed(items)))
    assert encode(frozenset(items)) == encode(frozenset(reversed(items)))
    assert encode(set(items)) != encode(frozenset(items))
    assert encode({"a": 1, "b": 2}) != encode({"b": 2, "a": 1})


def test_same_bytes_in_processes_with_different_hash_seeds() -> None:
    script = textwrap.dedent("""
        from cas_checkpoint.format.codec import encode
        words = {f"word-{i}" for i in range(200)}
        value = {"s": words, "f": frozenset(words), "nested": {(w, 1) for w in words}}
        print(list(words)[:5], encode(value).hex())
    """)
    outs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed,
               "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(__file__)),
                                              os.environ.get("PYTHONPATH", "")])}
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                             text=True, check=True).stdout
        order, hexdata = out.rsplit(" ", 1)
        outs.append((order, hexdata))
    assert outs[0][0] != outs[1][0], "the hash seeds should change set iteration order"
    assert outs[0][1] == outs[1][1]


# --------------------------------------------------------------------------- encode errors


def error_of(value: Any, types: TypeRegistry | None = REG) -> SerializationError:
    with pytest.raises(SerializationError) as info:
        encode(value, types=types)
    assert isinstance(info.value, TypeError)
    assert info.value.path in str(info.value)
    return info.value


def test_error_path_in_list() -> None:
    err = error_of({"tools": [1, 2, lambda: 0]})
    assert err.path == 'state["tools"][2]'
    assert "function" in str(err) and "convert it" in str(err)


class _Tz(tzinfo):
    def utcoffset(self, dt: Any) -> timedelta:
        return timedelta(0)

    def dst(self, dt: Any) -> timedelta:
        return timedelta(0)

    def tzname(self, dt: Any) -> str:
        return "custom"


class _Float(float):
    pass


@pytest.mark.parametrize(
    ("value", "path", "words"),
    [
        ({"a": Pair(1, 2)}, 'state["a"]', ["Pair", "subclass of tuple"]),
        (collections.OrderedDict(a=1), "state", ["OrderedDict", "dict(...)"]),
        ({"d": collections.defaultdict(list)}, 'state["d"]', ["defaultdict"]),
        ([Unregistered.A], "state[0]", ["not registered", "types=[Unregistered]"]),
        ({"p": Point(1, [Point(2, {"k": object()})])}, 'state["p"].y[0].y["k"]', ["object"]),
        ({("k", 1): [socket.socket]}, 'state[("k", 1)][0]', ["type"]),
        ({1: {"s": {(1, str.upper)}}}, 'state[1]["s"]{(1, <method', ["method_descriptor"]),
        ([datetime(2020, 1, 1, tzinfo=_Tz())], "state[0]", ["tzinfo", "ZoneInfo"]),
        ([dtime(1, tzinfo=_Tz())], "state[0]", ["tzinfo", "ZoneInfo"]),
        (["\ud800"], "state[0]", ["surrogate"]),
        ({"n": _Float(1.5)}, 'state["n"]', ["subclass of float", "float(...)"]),
        ({frozenset({Point}): 1}, "state<key frozenset(", ["type"]),
    ],
)
def test_error_paths(value: Any, path: str, words: list[str]) -> None:
    err = error_of(value)
    assert err.path.startswith(path), err.path
    for word in words:
        assert word in str(err), str(err)


def test_unregistered_dataclass_names_the_fix() -> None:
    err = error_of({"p": Point(1)}, types=None)
    assert err.path == 'state["p"]' and "types=[Point]" in str(err)


def test_socket_is_refused() -> None:
    with socket.socket() as sock:
        assert error_of({"conn": sock}).path == 'state["conn"]'


def test_cycles() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    err = error_of({"x": [0, loop]})
    assert err.path == 'state["x"][1][1]' and "cyclic" in str(err)
    d: dict[str, Any] = {}
    d["self"] = d
    assert error_of(d).path == 'state["self"]'
    holder: list[Any] = []
    holder.append((holder,))
    assert "cyclic" in str(error_of(holder))
    p = Point(1)
    p.y = [p]
    assert error_of(p).path == "state.y[0]"


def test_depth_limits() -> None:
    deep: Any = 0
    for _ in range(5000):
        deep = [deep]
    assert "too deep" in str(error_of(deep))
    ok: Any = 0
    for _ in range(MAX_EXT_DEPTH):
        ok = (ok,)
    roundtrip(ok)
    assert "too deep" in str(error_of((ok,)))
    assert "too deep" in str(error_of(_nest_in_tuples(datetime(2020, 1, 1), MAX_EXT_DEPTH)))
    roundtrip(_nest_in_tuples(datetime(2020, 1, 1), MAX_EXT_DEPTH - 1))
    assert error_of(_nest_in_tuples(Point(1), MAX_EXT_DEPTH)).path == "state" + "[0]" * 64
    # Below the outer levels, lists/dicts nest at most _DEEP_LIMIT deep (bounds C stack use).
    lists: Any = 0
    for _ in range(codec._DEEP_LIMIT + 5):
        lists = [lists]
    levels = codec._FREE_EXT_LEVELS
    roundtrip(_nest_in_tuples(lists, levels))
    err = error_of(_nest_in_tuples(lists, levels + 1))
    assert "too deep" in str(err) and err.path.startswith("state" + "[0]" * (levels + 1))


def _nest_in_tuples(value: Any, n: int) -> Any:
    for _ in range(n):
        value = (value,)
    return value


def test_never_writes_what_it_cannot_read_at_native_depth_limit() -> None:
    # msgpack packs one level deeper than it unpacks (an empty list at depth 1024): encode must
    # refuse exactly what decode could not read, in every kind of payload.
    limit = codec._NATIVE_LIMIT
    wrappers: list[tuple[Callable[[Any], Any], int]] = [
        (lambda v: v, limit),
        (lambda v: (v,), limit - 1),
        (lambda v: {(1,): v}, limit - 1),
        (lambda v: Point(1, v), limit - 2),
    ]
    for wrap, deepest in wrappers:
        leaves: list[Any] = [[], {}, 0, ()]
        for leaf in leaves:
            data = encode(wrap(_nest_in_lists(leaf, deepest)), types=REG)
            assert encode(decode(data, types=REG), types=REG) == data
            with pytest.raises(SerializationError, match="too deep"):
                encode(wrap(_nest_in_lists(leaf, deepest + 1)), types=REG)


def _nest_in_lists(value: Any, n: int) -> Any:
    for _ in range(n):
        value = [value]
    return value


def test_errors_from_reading_a_value_become_serialization_errors() -> None:
    @dataclasses.dataclass
    class Lazy:
        x: int = dataclasses.field(init=False)

    reg = TypeRegistry([Lazy])
    err = error_of({"l": Lazy()}, types=reg)
    assert err.path == 'state["l"]' and "AttributeError" in str(err)
    assert isinstance(err.__cause__, AttributeError)


# --------------------------------------------------------------------------- registry


def test_registry_rules() -> None:
    reg = TypeRegistry()
    reg.register(Point)
    reg.register(Point)  # idempotent
    assert Point in reg and Color not in reg and 3 not in reg
    with pytest.raises(InvalidArgumentError):
        reg.register(int)
    with pytest.raises(InvalidArgumentError):
        reg.register(Point(1))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="already uses"):
        reg.register(Color, name=f"{Point.__module__}.Point")
    with pytest.raises(InvalidArgumentError, match="already registered"):
        reg.register(Point, name="other")


def test_custom_name_is_what_is_stored() -> None:
    reg = TypeRegistry()
    reg.register(Point, name="geo.Point")
    data = encode(Point(1), types=reg)
    assert b"geo.Point" in data and b"test_codec" not in data
    assert decode(data, types=reg) == Point(1)
    other = TypeRegistry()
    other.register(Frozen, name="geo.Point")
    with pytest.raises(FormatError, match="cannot rebuild geo.Point"):
        decode(data, types=other)


def test_decode_without_registry_names_the_class() -> None:
    data = encode({"p": Point(1, 2)}, types=REG)
    with pytest.raises(FormatError, match=r"types=\[Point\]") as info:
        decode(data)
    assert "CheckpointStore.open" in str(info.value)
    with pytest.raises(FormatError, match=r"types=\[Color\]"):
        decode(encode(Color.RED, types=REG), types=TypeRegistry([Point]))


def test_enum_value_must_exist() -> None:
    data = encode(Color.RED, types=REG).replace(b"red", b"rex")
    with pytest.raises(FormatError, match="Color"):
        decode(data, types=REG)


def test_pydantic_models() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Inner(pydantic.BaseModel):  # type: ignore[misc,name-defined]
        when: datetime
        tags: frozenset[str] = frozenset()

    class Outer(pydantic.BaseModel):  # type: ignore[misc,name-defined]
        model_config = pydantic.ConfigDict(extra="allow")
        inner: Inner
        pair: tuple[int, str]
        renamed: int = pydantic.Field(alias="other")

    class Root(pydantic.RootModel[list[Inner]]):  # type: ignore[misc,name-defined]
        pass

    reg = TypeRegistry([Inner, Outer, Root])
    value = Outer(inner=Inner(when=datetime(2020, 1, 1, tzinfo=PARIS), tags={"a"}),
                  pair=(1, "x"), other=5, extra_field=[1])
    back = decode(encode(value, types=reg), types=reg)
    assert type(back) is Outer and type(back.inner) is Inner and back == value
    assert back.pair == (1, "x") and back.renamed == 5 and back.extra_field == [1]
    root = Root([value.inner])
    assert decode(encode(root, types=reg), types=reg) == root
    with pytest.raises(FormatError, match="Inner"):
        decode(encode(value, types=reg), types=TypeRegistry([Outer]))
    assert "not registered" in str(error_of(value, types=TypeRegistry([Outer])))


# --------------------------------------------------------------------------- refs


def test_refs_resolve() -> None:
    refs = [Ref(0), Ref(255), Ref(256), Ref(2**16), Ref(2**32), Ref(2**64 - 1)]
    data = b"\x82\xa8children\x96" + b"".join(map(encode_link, refs)) + b"\xa1t" + ext(
        3, b"\x91" + encode_link(Ref(7)))
    assert decode(data, resolve=lambda i: ("child", i)) == {
        "children": [("child", r.index) for r in refs], "t": (("child", 7),)}
    assert len(encode_link(Ref(3))) == 3
    with pytest.raises(FormatError, match="resolve"):
        decode(data)
    with pytest.raises(InvalidArgumentError):
        Ref(-1)
    with pytest.raises(InvalidArgumentError):
        Ref(True)


def test_spans_resolve() -> None:
    spans = [Span(1, 0, 3), Span(3, 127, 128), Span(255, 2**32 - 1, 0), Span(2, 300, 70000)]
    data = b"\x81\xa6joined\x94" + b"".join(map(encode_link, spans))
    assert decode(data, span=lambda *f: f) == {
        "joined": [(s.shape, s.start, s.count) for s in spans]}
    assert len(encode_link(Span(1, 0, 3))) == 6  # ext8 header + shape + two one-byte varints
    with pytest.raises(FormatError, match="span"):
        decode(data)
    for bad_span in ((256, 0, 0), (1, -1, 0), (1, 0, 2**32), (True, 0, 0)):
        with pytest.raises(InvalidArgumentError):
            Span(*bad_span)  # type: ignore[arg-type]
    ok = lambda *f: f  # noqa: E731
    for payload in (b"\x01\x00", b"\x01\x80\x00\x01", b"\x01\x00\x01\x00", b"\x01\x00\x80",
                    b"\x01" + b"\xff" * 5 + b"\x01\x00"):
        with pytest.raises(FormatError, match="Span"):  # short, not minimal, trailing, cut off
            decode(ext(14, payload), span=ok)


def test_placeholders_in_a_state_are_refused_with_their_path() -> None:
    for link in (Ref(0), Span(1, 0, 0)):
        with pytest.raises(SerializationError, match=r"reserved") as info:
            encode({"a": [1, link]})
        assert info.value.path == 'state["a"][1]'
    with pytest.raises(InvalidArgumentError):
        encode_link(3)  # type: ignore[arg-type]


def test_resolve_errors_pass_unchanged() -> None:
    class Missing(Exception):
        pass

    def resolve(index: int) -> Any:
        raise Missing(index)

    with pytest.raises(Missing):
        decode(b"\x91" + ext(3, b"\x91" + encode_link(Ref(1))), resolve=resolve)


# --------------------------------------------------------------------------- hostile bytes


def ext(code: int, payload: bytes) -> bytes:
    """An ext8/ext32 frame; unlike msgpack.ExtType it also allows the reserved codes < 0."""
    head = b"\xc7" + len(payload).to_bytes(1) if len(payload) < 256 else (
        b"\xc9" + len(payload).to_bytes(4))
    return head + code.to_bytes(1, signed=True) + payload


def nested_tuples(n: int) -> bytes:
    data = msgpack.packb(0)
    for _ in range(n):
        data = ext(3, b"\x91" + data)
    return bytes(data)


def bad(data: bytes, match: str | None = None, types: TypeRegistry | None = REG) -> FormatError:
    with pytest.raises(FormatError, match=match) as info:
        decode(data, types=types, resolve=lambda i: i)
    assert "corrupt" in str(info.value) or "registered" in str(info.value)
    with pytest.raises(FormatError):  # without callbacks (where ormsgpack may be tried first)
        decode(data, types=types)
    return info.value


def test_hostile_structure() -> None:
    good = encode({"a": [1, (2, 3)], "s": {1, 2}})
    bad(good + b"\x00", "trailing")
    for cut in range(len(good)):
        bad(good[:cut])
    bad(b"\xdd\xff\xff\xff\xff")  # array32 claiming 4G items
    bad(b"\xdf\xff\xff\xff\xff")  # map32 likewise
    bad(b"\x91" * 100_000, "deep")
    bad(b"\xc1")
    bad(b"\xa2\xff\xfe")  # invalid utf-8
    bad(b"\x81\x91\x01\x02")  # a list as a dict key
    bad(ext(4, b"\x91\x90"))  # a list in a set
    decode(nested_tuples(MAX_EXT_DEPTH))
    bad(nested_tuples(MAX_EXT_DEPTH + 1), "deeper")
    bad(nested_tuples(10_000))
    for code in (0, 2, 15, 127, -2, -128):
        bad(ext(code, b"\x00"), "unknown")
    bad(ext(3, b"\x91\x01\x02"), "trailing")
    deep_payload = nested_tuples(codec._UNPACKB_LEVELS + 1)[3:]  # handled by an Unpacker
    bad(_wrap_tuples(ext(3, deep_payload + b"\x00"), codec._UNPACKB_LEVELS), "trailing")
    bad(_wrap_tuples(ext(3, deep_payload[:-1]), codec._UNPACKB_LEVELS), "truncated")
    decode(_wrap_tuples(ext(3, deep_payload), codec._UNPACKB_LEVELS))


def _wrap_tuples(data: bytes, n: int) -> bytes:
    for _ in range(n):
        data = ext(3, b"\x91" + data)
    return data


def test_big_payloads_decode_quickly() -> None:
    for payload in (ext(11, b"9" * 4_000_000), ext(11, b"1" * 2_000_000 + b"E+99999"),
                    ext(1, b"\x7f" + b"\xff" * ((1 << 20) - 1)), msgpack.packb("x" * 10**7)):
        start = time.perf_counter()
        decode(payload)
        assert time.perf_counter() - start < 10.0  # a hang guard, not a speed target


@pytest.mark.parametrize("key", ["../../etc/passwd", "/etc/localtime", "Europe/../../x", "a//b",
                                 "Europe/Paris\x00", "Europe\\Paris", "x" * 300, ""])
def test_zone_keys_are_checked_before_lookup(key: str) -> None:
    bad(ext(6, msgpack.packb([2020, 1, 1, 0, 0, 0, 0, 0, key])), "invalid time zone key")


def test_msgpack_timestamp_decodes_to_a_utc_datetime() -> None:
    assert decode(b"\xd6\xff\x00\x00\x00\x01") == datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)


BAD_PAYLOADS = [
    (1, b""), (1, b"\x01"), (1, b"\x00" * 9), (1, b"\x00\x00" + b"\x01" * 8),
    (1, b"\x01" * ((1 << 20) + 1)),
    (3, b"\xc1"), (3, b"\x01"), (3, b""), (4, b"\x01"), (5, b"\xa1a"),
    (6, msgpack.packb([2020, 1, 1, 0, 0, 0, 0, 0])),
    (6, msgpack.packb([2020, 13, 1, 0, 0, 0, 0, 0, None])),
    (6, msgpack.packb([2020, 1, 1, 0, 0, 0, 0, 2, None])),
    (6, msgpack.packb([2020, "1", 1, 0, 0, 0, 0, 0, None])),
    (6, msgpack.packb([2020, True, 1, 0, 0, 0, 0, 0, None])),
    (6, msgpack.packb([2020, 1.0, 1, 0, 0, 0, 0, 0, None])),
    (6, msgpack.packb([2020, 1, 1, 0, 0, 0, 0, 0, "../../etc/passwd"])),
    (6, msgpack.packb([2020, 1, 1, 0, 0, 0, 0, 0, "/etc/localtime"])),
    (6, msgpack.packb([2020, 1, 1, 0, 0, 0, 0, 0, "No/Such_Zone"])),
    (6, msgpack.packb([2020, 1, 1, 0, 0, 0, 0, 0, "a" * 300])),
    (6, msgpack.packb([2020, 1, 1, 0, 0, 0, 0, 0, [86_400_000_000, None]])),
    (6, msgpack.packb([2020, 1, 1, 0, 0, 0, 0, 0, [0, 1]])),
    (6, msgpack.packb([2020, 1, 1, 0, 0, 0, 0, 0, [0]])),
    (6, msgpack.packb([2020, 1, 1, 0, 0, 0, 0, 0, 5])),
    (6, msgpack.packb([2**63, 1, 1, 0, 0, 0, 0, 0, None])),
    (6, msgpack.packb({"y": 2020})),
    (7, msgpack.packb([2020, 2, 30])), (7, msgpack.packb([2020, 2])), (7, b"\x00"),
    (8, msgpack.packb([24, 0, 0, 0, 0, None])), (8, msgpack.packb([1, 0, 0, 0, 0])),
    (9, msgpack.packb([10**10, 0, 0])), (9, msgpack.packb([1, 2, 3, 4])),
    (9, msgpack.packb([1, 2, "3"])),
    (10, b"\x00" * 15), (10, b"\x00" * 17),
    (11, b""), (11, b"abc"), (11, b" 1"), (11, b"1_000"), (11, "١".encode()), (11, b"\xff"),
    (11, b"1E+99999999999999999999"),
    (12, b""), (12, b"\x00\x01"), (12, b"\x00" * 3), (12, b"\x00" * 9), (12, b"\x00\x00\x00\x01"),
    (13, msgpack.packb(["x"])), (13, msgpack.packb([1, {}])), (13, msgpack.packb("x")),
    (13, msgpack.packb(["os.system", ["echo pwned"]])),
    (13, msgpack.packb([f"{Point.__module__}.Point", {"x": 1, "nope": 2}])),
    (13, msgpack.packb([f"{Point.__module__}.Point", {1: 1}])),
    (13, msgpack.packb([f"{Point.__module__}.Point", [1, 2]])),
    (13, msgpack.packb([f"{Color.__module__}.Color", "green"])),
]


@pytest.mark.parametrize(("code", "payload"), BAD_PAYLOADS)
def test_bad_ext_payloads(code: int, payload: bytes) -> None:
    bad(ext(code, payload))
    bad(msgpack.packb([1, {"k": msgpack.ExtType(code, payload)}]))


def test_bigint_payload_cap() -> None:
    big = 2 ** (8 * (1 << 20) - 2)
    assert decode(encode(big)) == big
    with pytest.raises(SerializationError, match="8 million bits"):
        encode(big * 4)


def test_unknown_class_name_is_never_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_import(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("decode imported something")

    payload = ext(13, msgpack.packb(["os.system", "echo pwned"]))
    monkeypatch.setattr("builtins.__import__", no_import)
    try:
        decode(payload, types=REG)
    except FormatError as exc:
        error: Exception = exc
    monkeypatch.undo()
    assert isinstance(error, FormatError) and "not registered" in str(error)


def check_decode(data: bytes) -> None:
    start = time.perf_counter()
    try:
        decode(data, types=REG, resolve=lambda i: i)
    except FormatError:
        pass
    try:  # without callbacks (where ormsgpack may be tried first)
        decode(data, types=REG)
    except FormatError:
        pass
    assert time.perf_counter() - start < 10.0  # a hang guard, not a speed target


@given(st.binary(max_size=300))
@settings(max_examples=500)
def test_fuzz_random_bytes(data: bytes) -> None:
    check_decode(data)


@given(st.integers(-128, 127), st.one_of(st.binary(max_size=40), values.map(
    lambda v: encode(v, types=REG))))
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_fuzz_ext_payloads(code: int, payload: bytes) -> None:
    check_decode(ext(code, payload))


@given(values, st.lists(st.tuples(st.sampled_from(["flip", "insert", "delete"]),
                                  st.integers(0, 10_000), st.integers(0, 255)),
                        min_size=1, max_size=4))
@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
def test_fuzz_mutations(value: Any, edits: list[tuple[str, int, int]]) -> None:
    data = bytearray(encode(value, types=REG))
    for op, pos, byte in edits:
        pos %= len(data) + 1
        if op == "insert":
            data.insert(pos, byte)
        elif data and op == "flip":
            data[pos % len(data)] ^= byte or 1
        elif data:
            del data[pos % len(data)]
    check_decode(bytes(data))


# --------------------------------------------------------------------------- safety limits

STACK_SCRIPT = """
import sys, threading
from cas_checkpoint.format.codec import decode, encode, MAX_EXT_DEPTH, _NATIVE_LIMIT, _DEEP_LIMIT
from cas_checkpoint.errors import FormatError, SerializationError
import msgpack
threading.stack_size(int(sys.argv[1]))
result = []

def hostile():
    data = msgpack.packb(0)
    for level in range(MAX_EXT_DEPTH + 5):
        data = msgpack.packb(msgpack.ExtType(3, b"\\x91" * 1000 + data))
    try:
        decode(data)
    except FormatError:
        result.append("decode refused")

def deepest():  # the deepest value encode accepts: tuples holding lists as deep as allowed
    value = 0
    for level in range(MAX_EXT_DEPTH, -1, -1):
        for _ in range(_NATIVE_LIMIT - 1 if level <= 2 else _DEEP_LIMIT - 1):
            value = [value]
        value = (value,) if level else [value]
    back = decode(encode(value))
    try:
        encode([(back,)])
    except SerializationError:
        result.append("encode ok")

for job in (hostile, deepest):
    t = threading.Thread(target=job)
    t.start()
    t.join()
print(result)
"""


@pytest.mark.parametrize(("job", "stack"), [("decode", 512 * 1024), ("encode", 8 << 20)])
def test_deep_values_do_not_crash_the_interpreter(job: str, stack: int) -> None:
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))}
    script = STACK_SCRIPT if job == "encode" else STACK_SCRIPT.replace(
        "(hostile, deepest)", "(hostile,)")
    proc = subprocess.run([sys.executable, "-c", script, str(stack)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    expected = ["decode refused", "encode ok"] if job == "encode" else ["decode refused"]
    assert proc.stdout.strip() == repr(expected)


# --------------------------------------------------------------------------- fast path


def test_plain_state_never_reaches_python(monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"messages": [{"role": "user", "content": f"m{i}", "n": i} for i in range(100)]}
    data, with_tuple = encode(state), encode((1,))

    def fail(*args: Any) -> Any:
        raise AssertionError("Python hook called for a native value")

    monkeypatch.setattr(codec, "_reduce", fail)
    monkeypatch.setattr(codec._Decoder, "ext_hook", fail)
    assert encode(state) == data
    assert decode(data) == state
    with pytest.raises(FormatError, match="Python hook called"):
        decode(with_tuple)


# --------------------------------------------------------------------------- the two decoders


def _outcome(data: bytes, fast: bool) -> tuple[str, Any]:
    """What decode gives with ormsgpack tried first (fast) or msgpack alone."""
    saved = decoding.FAST_UNPACKB, decoding.FAST_MIN
    decoding.FAST_UNPACKB, decoding.FAST_MIN = (decoding._accelerator(), 0) if fast else (None, 0)
    try:
        return "value", decode(data, types=REG)
    except FormatError as exc:
        return "error", str(exc)
    finally:
        decoding.FAST_UNPACKB, decoding.FAST_MIN = saved


def _same_outcome(data: bytes) -> None:
    fast, plain = _outcome(data, True), _outcome(data, False)
    if fast[0] != plain[0] or fast[0] == "error":
        assert fast == plain, (data[:100], fast, plain)
        return
    stack = [(fast[1], plain[1])]  # ``same``, without recursing on deep lists
    while stack:
        a, b = stack.pop()
        assert type(a) is type(b), (data[:100], a, b)
        if type(a) in (list, tuple):
            assert len(a) == len(b)
            stack.extend(zip(a, b, strict=True))
        elif type(a) is dict:
            assert len(a) == len(b) and all(map(same, a, b))
            stack.extend(zip(a.values(), b.values(), strict=True))
        else:
            assert same(a, b), (data[:100], a, b)


DIFFERENCES = [  # where ormsgpack alone would not give msgpack's result
    encode(1) + b"\x00", encode({"a": [1, 2]}) + encode("x"), b"\x81\x91\x01\x02",
    b"\x81\x92\x01\x02\x03", b"\x81\x80\x01", b"\x81\x01\x02", b"\x81\xc4\x01a\x02",
    b"\x81\xc0\x01", b"\xd6\xff\x00\x00\x00\x01", msgpack.packb({"a": msgpack.Timestamp(1, 5)}),
    b"\x82\xa1a\x01\xa1a\x02", b"\x83\xa1a\x01\xa1b\x02\xa1a\x03", b"", b"\xc4\x10",
    b"\x92\x01", b"\x91" * 1021 + b"\x00", b"\x91" * 1022 + b"\x00", b"\x91" * 1023 + b"\x00",
    b"\x91" * 1024 + b"\x00", b"\x91" * 100_000, b"\xdd\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff",
    b"\xa2\xff\xfe", b"\xa3\xed\xa0\x80", b"\xca\x3f\x80\x00\x00", encode(2**64 - 1),
    encode({(1, 2): 3}), encode({"k": {1, 2}}), ext(13, msgpack.packb(["os.system", "x"])),
    ext(-5, b"\x00"), encode(float("nan")), encode(-0.0), encode({1.5: None, b"k": True}),
]


@pytest.mark.skipif(not HAS_ORMSGPACK, reason="ormsgpack is not installed")
@pytest.mark.parametrize("data", DIFFERENCES, ids=range(len(DIFFERENCES)))
def test_both_decoders_give_the_same_outcome(data: bytes) -> None:
    _same_outcome(data)


@pytest.mark.skipif(not HAS_ORMSGPACK, reason="ormsgpack is not installed")
@given(st.one_of(st.binary(max_size=300), values.map(lambda v: encode(v, types=REG))),
       st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3))
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_both_decoders_give_the_same_outcome_fuzzed(data: bytes,
                                                    edits: list[tuple[int, int]]) -> None:
    out = bytearray(data)
    for pos, byte in edits:
        if out:
            out[pos % len(out)] = byte
    _same_outcome(bytes(out))


@pytest.mark.skipif(not HAS_ORMSGPACK, reason="ormsgpack is not installed")
def test_ormsgpack_runs_only_where_it_is_safe(decoder: str, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    calls: list[int] = []
    real = decoding._accelerator()
    assert real is not None

    def spy(data: bytes, **kwargs: Any) -> Any:
        calls.append(len(data))
        return real(data, **kwargs)

    monkeypatch.setattr(decoding, "FAST_UNPACKB", spy)
    monkeypatch.setattr(decoding, "FAST_MIN", 4096)
    state = {"messages": [{"role": "user", "content": "m" * 100, "n": i} for i in range(100)]}
    data = encode(state)
    assert decode(data) == state and len(calls) == 1  # the main thread, a big input: used
    assert decode(encode([1])) == [1] and len(calls) == 1  # small: not worth it
    assert decode(data, resolve=lambda i: i) == state and len(calls) == 1  # callbacks: once
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(decode(data)))
    thread.start()
    thread.join()
    assert got == [state] and len(calls) == 1  # another thread (its stack may be small)
    monkeypatch.setattr(decoding, "FAST_STACK", 1 << 62)
    assert decode(data) == state and len(calls) == 1  # a main stack limit under FAST_STACK
