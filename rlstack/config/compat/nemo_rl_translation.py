"""One NeMo RL config's translation into rlstack's keys: the values being rewritten, where each key was
set, and what the rules (`nemo_rl_rules`, `nemo_rl_data`) find."""

from __future__ import annotations

import copy
import re
from typing import Any

import rlstack.config.tree as tree

_REFERENCE = re.compile(r"^\$\{([A-Za-z_][\w.]*)\}$")


class Translation:
    """One config's translation: the values being rewritten, where each key was set, and what it finds."""

    def __init__(self, values: dict, sources: dict[str, str], problems: list[str]):
        self.values, self.sources, self.problems = values, sources, problems
        self.notes: list[str] = []
        self.original = copy.deepcopy(values)
        self.env: str | None = None  # the NeMo RL environment the reward was read from (`_env`)

    def at(self, key: str) -> str:
        return tree.where_set(self.sources, key)

    def get(self, key: str) -> Any:
        """rlstack's (or a not yet translated NeMo RL) key's value as it stands, or `tree.MISSING`."""
        return tree.get(self.values, key)

    def take(self, key: str) -> Any:
        """Remove a NeMo RL key; its value, following `${other.key}` references."""
        tree.pop(self.values, key)
        value, seen = tree.get(self.original, key), set()
        while isinstance(value, str) and (m := _REFERENCE.match(value)) and m.group(1) not in seen:
            seen.add(m.group(1))
            value = tree.get(self.original, m.group(1))
        return value

    def move(self, key: str, to: str, value: Any, spellings: dict | None = None) -> None:
        """Set rlstack's `to` from NeMo RL's `key` (the command line's own `to` wins)."""
        if self.get(to) is not tree.MISSING:
            if self.sources.get(to, "").startswith("command-line"):
                self.notes.append(f"{key}{self.at(key)}: NeMo RL's key for {to}, which the command line sets")
            else:
                self.problems.append(
                    f"{key}{self.at(key)} is NeMo RL's name for {to}, which is set too: keep {to} only"
                )
            return
        if spellings is not None and hashable(value) and value in spellings:
            value = spellings[value]
        tree.set(self.values, to, value)
        self.notes.append(f"{key}{self.at(key)}: NeMo RL's key, read as {to}={value}")


def setting(t: Translation, name: str) -> tuple[str, Any]:
    """NeMo RL's data setting `name` for the training rows: `data.train.<name>`, else `data.default.<name>`
    (every dataset's), else the older layout's `data.<name>`. All are read out, the overridden ones noted;
    returns the key that applies and its value (`tree.MISSING` where none is set)."""
    keys = [f"data.train.{name}", f"data.default.{name}", f"data.{name}"]
    found = [(k, t.take(k)) for k in keys if t.get(k) is not tree.MISSING]
    if not found:
        return keys[0], tree.MISSING
    (key, value), *overridden = found
    for k, _ in overridden:
        t.notes.append(f"{k}{t.at(k)}: NeMo RL's key, not used: {key} is set")
    return key, value


def hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
