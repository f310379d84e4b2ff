"""A field's range beside the field: `field(1.0e-6, ge=0)` is `dataclasses.field` with the interval its
value must lie in, kept as metadata; `range_problems` walks a config and names every value outside.

Choices need no metadata: a `Literal[...]` type is the list of them, checked when the config is built.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Range:
    """The values a number may take: within the bounds that are set, or one of `also`."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    also: tuple = ()
    """Values allowed outside the bounds, each with a meaning of its own (-1: all)."""
    why: str = ""
    """Said after the rule, in parentheses."""

    def holds(self, value: float) -> bool:
        if value in self.also:
            return True
        if isinstance(value, float) and not math.isfinite(value):  # inf or nan, unless `also` names it
            return False
        return (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        )

    def rule(self, optional: bool) -> str:
        """`must be in [0, 1)`, `must be at least 1, or -1`, ..., as a problem ends."""
        low = ("[", self.ge) if self.ge is not None else ("(", self.gt) if self.gt is not None else None
        high = (self.le, "]") if self.le is not None else (self.lt, ")") if self.lt is not None else None
        if low and high:
            text = f"in {low[0]}{low[1]}, {high[0]}{high[1]}"
        elif low:
            text = f"at least {low[1]}" if low[0] == "[" else "positive" if low[1] == 0 else f"above {low[1]}"
        else:
            assert high is not None
            text = f"at most {high[0]}" if high[1] == "]" else f"below {high[0]}"
        extra = [str(v) for v in self.also] + ["null"] * optional
        why = f" ({self.why})" if self.why else ""
        return f"must be {text}{''.join(f', or {v}' for v in extra)}{why}"


def field(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    also: tuple = (),
    why: str = "",
    resume: bool = False,
) -> Any:
    """`dataclasses.field`, with the range its number must lie in (`ge`, `gt`, `le`, `lt`; `also`: values
    allowed besides). None passes where the field is optional; a list's items are checked one by one.
    `resume=True`: the value may change when a run resumes from its checkpoint (how long it runs, what it
    logs, validates and saves, how the work is cut); any other change stops the resume (`resume.py`)."""
    bounds = (ge, gt, le, lt)
    metadata: dict[str, Any] = (
        {"range": Range(*bounds, also, why)} if any(b is not None for b in bounds) else {}
    )
    if resume:
        metadata["resume"] = True
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def resumable_keys(cls: type, prefix: str = "") -> set[str]:
    """The dotted keys of `cls` (a config dataclass) declared with `field(..., resume=True)`."""
    keys: set[str] = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            keys |= resumable_keys(hints[f.name], f"{prefix}{f.name}.")
        elif f.metadata.get("resume"):
            keys.add(f"{prefix}{f.name}")
    return keys


def range_problems(section: Any, prefix: str = "") -> list[str]:
    """`key = value: must be ...` for every value of `section` (and the sections in it) out of its range."""
    problems = []
    hints = typing.get_type_hints(type(section))
    for f in dataclasses.fields(section):
        key, value = f"{prefix}{f.name}", getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            problems += range_problems(value, key + ".")
            continue
        rng = f.metadata.get("range")
        if rng is None or value is None:
            continue
        items = (
            [(f"{key}[{i}]", v) for i, v in enumerate(value)] if isinstance(value, list) else [(key, value)]
        )
        optional = type(None) in typing.get_args(hints[f.name])
        problems += [
            f"{k} = {v}: {'' if _finite(v) else 'not a finite number; '}{rng.rule(optional)}"
            for k, v in items
            if not rng.holds(v)
        ]
    return problems


def _finite(value: Any) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def choices(tp: Any) -> tuple:
    """The values a `Literal[...]` (or optional Literal) type allows; () for other types."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return tuple(c for arg in typing.get_args(tp) for c in choices(arg))
    return ()


def choice_enum(name: str, literal: Any, module: str) -> type[enum.Enum]:
    """A str Enum with one member per choice of the config's `literal` (`kl+` -> KL_PLUS, `token-mean` ->
    TOKEN_MEAN), defined in `module` (the caller's `__name__`: pickle finds the class there, as it would a
    class statement's): the algorithms name the choices the config declares, and a choice added to the
    config is a member at once."""
    values = choices(literal)
    members = {str(v).upper().replace("+", "_PLUS").replace("-", "_"): v for v in values}
    if len(members) != len(values):
        raise ValueError(f"{name}: two of the choices {values} make the same member name")
    return enum.Enum(name, members, module=module, type=str)  # type: ignore[return-value]


def type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
