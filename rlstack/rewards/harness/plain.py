"""Plain data across the border between the program's process and the test's (`harness/`).

Only these cross, recursively: None, bool, int, float, complex, str, bytes, bytearray, list, tuple,
dict, set and frozenset. A subclass of one of them (a namedtuple, `Counter`, `OrderedDict`,
`defaultdict`, an `IntEnum` member) crosses as its base type's value, read with the base type's own
methods, so no method of the subclass runs on the receiving side and none of its behaviour comes
along. Anything else (an object of the program's own class, a function, a generator, `Fraction`,
`Decimal`) does not cross: encoding it raises `NotPlain`, which the test's process turns into a
failure of its own status (`not_plain_data`). A value too deep to walk (or that holds itself) does
not cross either.

The wire form is JSON: scalars as themselves (floats keep nan, inf and -0.0), containers as arrays
tagged by their first element (`["l", ...]` list, `["t", ...]` tuple, `["s", ...]` set, `["f", ...]`
frozenset, `["d", k1, v1, ...]` dict, `["b", hex]` bytes, `["a", hex]` bytearray, `["c", re, im]`
complex) and `["h", id, type name]` a handle: a reference to an object that stays in the program's
process, allowed only where the receiver says so (`from_wire(..., handle=...)`).

A message is a JSON array: its kind (a string), then its parts in wire form (`pack`, `unpack`), sent
as a frame: a 4-byte big-endian length, then that many bytes; a frame longer than the receiver's
limit is refused before it is read.

This file runs inside the sandbox in both processes (the scripts are put together by
`harness/__init__.py`), so it imports nothing but the standard library.
"""

from __future__ import annotations

import _json
import posix  # not `os`: a `-I -S` interpreter has not imported it, and its import costs each process ~1 ms

MAX_FRAME = 64 << 20
"""The largest message either side reads (bytes); a longer one fails the test."""
_LENGTH = 4


class NotPlain(Exception):
    """A value that cannot cross the border (its reason says which and where)."""


def plain_type(kind: type) -> type | None:
    """The plain type a value of type `kind` crosses as (its own, or the plain base of a subclass), else None."""
    if kind in _TAGS or kind in _SCALARS:
        return kind
    for base in _BASES:
        if issubclass(kind, base):  # the real type: `__class__` may say anything
            return base
    return None


_SCALARS = (type(None), bool, int, float, str)
MUTABLE = (list, dict, set, bytearray)
"""The plain types an argument the program changes comes back in (copied into the test's own object)."""
_TAGS = {list: "l", tuple: "t", set: "s", frozenset: "f", dict: "d", bytes: "b", bytearray: "a", complex: "c"}
_BASES = (bool, int, float, str, bytes, bytearray, complex, list, tuple, dict, set, frozenset)
_READ = {
    int: int.__int__,
    float: float.__float__,
    str: str.__str__,
}


def to_wire(value: object, other=None, where: str = "the value") -> object:
    """`value` as JSON-ready data; `other(value)` gives the wire form of a value that is not plain
    (a handle), or raises `NotPlain` (the default)."""
    try:
        return _to_wire(value, other, where)
    except RecursionError:
        raise NotPlain(f"{where} is nested too deeply (or holds itself)") from None


def _to_wire(value: object, other, where: str) -> object:
    kind = type(value)
    base = plain_type(kind)
    if base is None:
        if other is None:
            raise NotPlain(f"{where}: a {type_name(kind)}, which is not plain data")
        return other(value)
    if base is bool or kind is type(None):
        return value
    if base in _READ:
        return value if kind is base else _READ[base](value)
    if base is bytes or base is bytearray:
        return [_TAGS[base], bytes(memoryview(value)).hex()]
    if base is complex:
        number = complex.__complex__(value)
        return ["c", number.real, number.imag]
    if base is dict:
        out = ["d"]
        for key, item in dict.items(value):
            out.append(_to_wire(key, other, where))
            out.append(_to_wire(item, other, where))
        return out
    items = base.__iter__(value)
    return [_TAGS[base], *(_to_wire(item, other, where) for item in items)]


def type_name(kind: type) -> str:
    module = type.__getattribute__(kind, "__module__")
    name = type.__getattribute__(kind, "__qualname__")
    return name if module == "builtins" else f"{module}.{name}"


def from_wire(data: object, handle=None) -> object:
    """The value of JSON-ready `data`; `handle(id)` makes the value of a handle (None: handles are
    refused). Raises `NotPlain` for anything that is not a well-formed plain value."""
    try:
        return _from_wire(data, handle)
    except RecursionError:
        raise NotPlain("a value nested too deeply") from None
    except (TypeError, ValueError, LookupError) as e:
        raise NotPlain(f"a malformed value ({type(e).__name__}: {e})") from None


def _from_wire(data: object, handle) -> object:
    kind = type(data)
    if kind is not list:
        if kind in _SCALARS:
            return data
        raise NotPlain(f"a malformed value ({type_name(kind)})")
    tag, items = data[0], data[1:]
    if tag == "l":
        return [_from_wire(item, handle) for item in items]
    if tag == "t":
        return tuple(_from_wire(item, handle) for item in items)
    if tag == "s":
        return {_from_wire(item, handle) for item in items}
    if tag == "f":
        return frozenset(_from_wire(item, handle) for item in items)
    if tag == "d":
        if len(items) % 2:
            raise NotPlain("a malformed dict")
        values = [_from_wire(item, handle) for item in items]
        return dict(zip(values[0::2], values[1::2]))
    if tag in ("b", "a") and len(items) == 1 and type(items[0]) is str:
        raw = bytes.fromhex(items[0])
        return raw if tag == "b" else bytearray(raw)
    if tag == "c" and len(items) == 2 and all(type(x) in (int, float) for x in items):
        return complex(items[0], items[1])
    if tag == "h" and len(items) == 2 and type(items[0]) is int and type(items[1]) is str:
        if handle is None:
            raise NotPlain(f"a {items[1][:200]}, an object of the program's where only plain data may be")
        return handle(items[0], items[1][:200])
    raise NotPlain(f"a malformed value (tag {tag!r})")


class _Reading:
    """What `_json`'s scanner reads off its context (`json.decoder.JSONDecoder`'s attributes): the C
    scanner alone, without `json`'s import of `re`, which costs each process of a run ~5 ms."""

    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int
    parse_constant = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}.__getitem__


_scan = _json.make_scanner(_Reading())
_write = _json.make_encoder(None, None, _json.encode_basestring_ascii, None, ":", ",", False, False, True)


def parse_json(text: str) -> object:
    """A JSON text's value (objects as dicts); `NotPlain` when it is not one JSON value."""
    try:
        value, end = _scan(text, 0)
    except (ValueError, StopIteration, RecursionError) as e:
        raise NotPlain(f"malformed JSON ({type(e).__name__})") from None
    if end != len(text):
        raise NotPlain("malformed JSON (text after the value)")
    return value


def json_text(data: object) -> str:
    """JSON-ready `data` (wire form, or a dict of plain scalars) as compact JSON text."""
    return "".join(_write(data, 0))


def pack(kind: str, *parts: object) -> bytes:
    """A message's bytes: its kind and its parts, each already in wire form (`to_wire`)."""
    return json_text([kind, *parts]).encode()


def unpack(raw: bytes) -> tuple[str, list]:
    """(kind, parts in wire form) of a message; `NotPlain` when it is not one."""
    try:
        data = parse_json(raw.decode())
    except UnicodeDecodeError:
        raise NotPlain("a malformed message (not UTF-8)") from None
    if type(data) is not list or not data or type(data[0]) is not str:
        raise NotPlain("a malformed message")
    return data[0], data[1:]


def send(fd: int, raw: bytes) -> None:
    """Write one frame."""
    view = memoryview(len(raw).to_bytes(_LENGTH, "big") + raw)
    while view:
        view = view[posix.write(fd, view) :]


def receive(fd: int, limit: int = MAX_FRAME) -> bytes:
    """Read one frame; EOFError when the other side is gone, NotPlain when it announces more than `limit`."""
    size = int.from_bytes(_read_exactly(fd, _LENGTH), "big")
    if size > limit:
        raise NotPlain(f"a message of {size} bytes, over the limit of {limit}")
    return _read_exactly(fd, size)


def _read_exactly(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = posix.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
