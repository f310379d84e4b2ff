"""Dotted keys in a nested dict (a config as it is read, before it is built): get, pop and set
`a.b.c`, and where a key was set, for messages."""

from __future__ import annotations

from typing import Any

MISSING = object()
"""What `get` and `pop` return for a key that is not there."""


def get(values: dict, dotted: str) -> Any:
    node: Any = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def pop(values: dict, dotted: str) -> Any:
    *parents, last = dotted.split(".")
    node: Any = values
    for part in parents:
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    if not isinstance(node, dict) or last not in node:
        return MISSING
    return node.pop(last)


def set(values: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = values
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def is_count(value: Any) -> bool:
    """Whether a value as read is a whole number of at least 1 (YAML's `true` is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def where_set(sources: dict[str, str], key: str) -> str:
    """` (file, line N)` where `key` (or a key under it) was set, for messages; empty if nowhere known."""
    where = sources.get(key) or next((v for k, v in sources.items() if k.startswith(key + ".")), "")
    return f" ({where})" if where else ""


def merge(into: dict, new: dict) -> None:
    """Merge `new` into `into`, dicts key by key, anything else replaced."""
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            merge(into[k], v)
        else:
            into[k] = v


def at(where: str) -> str:
    """` (where)` for a message, or nothing."""
    return f"({where})" if where else ""
