"""What crosses between the program's process and the test's (`rlstack/rewards/harness/plain.py`)."""

from __future__ import annotations

import collections
import enum
import math
import os
import sys
from fractions import Fraction

import pytest

from rlstack.rewards.harness import plain


def _cross(value, handle=None, other=None):
    return plain.from_wire(plain.unpack(plain.pack("ok", plain.to_wire(value, other)))[1][0], handle)


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -(10**5000),  # past Python's 4300-digit limit for int <-> str
        1.5,
        -0.0,
        math.inf,
        "é\udc80\n\x00",
        b"\x00\xff",
        bytearray(b"ab"),
        2 + 3j,
        [1, [2, (3, {4})]],
        (),
        {(1, "a"): frozenset({1, 2}), None: {"k": [b"v"]}, 2.5: True},
    ],
    ids=lambda v: type(v).__name__,
)
def test_plain_values_cross_unchanged(value):
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # as both processes of a run do
    try:
        back = _cross(value)
    finally:
        sys.set_int_max_str_digits(limit)
    assert back == value and type(back) is type(value)
    if isinstance(value, float):
        assert math.copysign(1, back) == math.copysign(1, value)


def test_nan_crosses_as_nan():
    assert math.isnan(_cross(math.nan))


def test_subclasses_cross_as_their_base_values_without_their_methods():
    class Lying(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

        def __int__(self):
            return 99

    class Color(enum.IntEnum):
        RED = 3

    point = collections.namedtuple("Point", "x y")(1, 2)
    values = [Lying(5), Color.RED, point, collections.Counter("aab"), collections.OrderedDict(a=1)]
    back = _cross(values)
    assert back == [5, 3, (1, 2), {"a": 2, "b": 1}, {"a": 1}]
    assert [type(v) for v in back] == [int, int, tuple, dict, dict]


@pytest.mark.parametrize(
    ("value", "name"),
    [
        (Fraction(1, 2), "fractions.Fraction"),
        ([1, object()], "object"),
        ({"k": lambda: 0}, "function"),
        ((i for i in range(2)), "generator"),
    ],
)
def test_other_values_do_not_cross(value, name):
    with pytest.raises(plain.NotPlain, match=f"a {name}, which is not plain data"):
        plain.to_wire(value, None, "what f returned")


def test_a_value_that_holds_itself_does_not_cross():
    loop: list = []
    loop.append(loop)
    with pytest.raises(plain.NotPlain, match="nested too deeply"):
        plain.to_wire(loop)


def test_a_class_claiming_a_plain_type_does_not_cross():
    class Fake:
        __class__ = int  # isinstance(Fake(), int) is True; its real type is not int

    assert isinstance(Fake(), int)
    with pytest.raises(plain.NotPlain):
        plain.to_wire(Fake())


def test_handles_only_where_the_receiver_allows_them():
    wire = plain.to_wire([1, "x"], other=lambda value: ["h", 7, "P"])
    assert plain.from_wire(plain.to_wire(["a"])) == ["a"]
    with_handle = ["l", 1, ["h", 7, "Point"]]
    with pytest.raises(
        plain.NotPlain, match="a Point, an object of the program's where only plain data may be"
    ):
        plain.from_wire(with_handle)
    assert plain.from_wire(with_handle, handle=lambda ident, kind: (kind, ident)) == [1, ("Point", 7)]
    assert wire == ["l", 1, "x"]


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"[]",
        b'{"a": 1}',
        b'["ok", ["z", 1]]',
        b'["ok", ["d", 1]]',
        b'["ok", ["s", ["l"]]]',
        b"[" * 100000,
    ],
)
def test_malformed_messages_are_refused(raw):
    with pytest.raises(plain.NotPlain):
        kind, parts = plain.unpack(raw)
        for part in parts:
            plain.from_wire(part)


def test_a_frame_over_the_limit_is_refused_before_it_is_read():
    read, write = os.pipe()
    try:
        os.write(write, (10**9).to_bytes(4, "big") + b"x" * 100)
        with pytest.raises(plain.NotPlain, match="over the limit"):
            plain.receive(read, limit=1 << 20)
        assert os.read(read, 200) == b"x" * 100  # nothing past the length was taken
        plain.send(write, b'["ok"]')
        assert plain.receive(read) == b'["ok"]'
        os.close(write)
        with pytest.raises(EOFError):
            plain.receive(read)
    finally:
        os.close(read)
