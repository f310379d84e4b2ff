"""OmegaConf interpolations in a config (`${oc.env:HOME}`, `${oc.env:X,default}`, `${data.max_prompt_length}`,
`${.sibling}`), resolved by OmegaConf's own resolver over the merged file and overrides laid on the
defaults (an EasyR1 file's are EasyR1's, as there; else rlstack's), before the config is built: a
reference keeps its value's type, an environment variable's text is read as the field's type where it
must be, and every problem names its key and where it was set (`load.py` reports them with the rest)."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import re
import typing
import warnings
from typing import Any

import yaml
from omegaconf import OmegaConf

import rlstack.config.tree as tree
from rlstack.config.schema import MASK, Config, hide_secrets, is_secret


@dataclasses.dataclass(frozen=True)
class Interpolated:
    """A value an OmegaConf interpolation gave."""

    text: str
    """As written: `${oc.env:HOME}/data`, `${data.max_prompt_length}`."""
    secret: bool
    """It holds the value of an environment variable whose name marks a secret (`is_secret`)."""


RESOLVERS_OF_THE_SEEDS = {"mul": lambda a, b: a * b}
"""Resolvers the seed systems register for their configs besides OmegaConf's own `oc.*`: NeMo RL's
`${mul:a,b}` (its dynamic batching's token budgets)."""

_ENV_NAME = re.compile(r"oc\.env\s*:\s*['\"]?([^,}'\"\s]+)")
_REFERENCE = re.compile(r"\$\{\s*(\.*[A-Za-z_][\w\-]*(?:(?:\.|\[)[\w\-\]]*)*)\s*\}")
"""`${a.b}`, `${.sibling}`, `${a.list[0]}` (not `${oc.env:X}`, which has a resolver's name and a colon)."""


def resolve_interpolations(
    values: dict, sources: dict[str, str], problems: list[str], dialect: dict[str, Any] | None = None
) -> dict[str, Interpolated]:
    """Resolve, in place, every OmegaConf interpolation of the merged config `values` as OmegaConf does:
    `${oc.env:VAR}` and `${oc.env:VAR,default}`, references to other keys (`${data.max_prompt_length}`,
    relative `${.n}`), with OmegaConf's own resolver, so that the merged file and command line are what
    they refer to and a key the config leaves unset is the default it takes in this run: the config's
    dialect's where `dialect` gives one (dotted key -> value: EasyR1's defaults for an EasyR1 file, which
    EasyR1 merges with the file before it resolves), else rlstack's. A reference gives the value with its
    type (`${data.max_prompt_length}` is an int); `\\${` is a literal `${`, and a `$` not followed by `{`
    is left as it is. What cannot be resolved is a problem naming the key, where it was set and why.
    Returns the keys resolved (dotted) -> how."""
    found = list(_interpolations(values, ()))
    if not found:
        return {}
    for name, resolver in RESOLVERS_OF_THE_SEEDS.items():
        if not OmegaConf.has_resolver(name):
            with warnings.catch_warnings():  # omegaconf 2.4 calls it register_resolver (2.3's is another)
                warnings.simplefilter("ignore", UserWarning)
                OmegaConf.register_new_resolver(name, resolver)
    full = dataclasses.asdict(Config())  # a reference to a key no file sets reads its default
    for key, value in (dialect or {}).items():
        tree.set(full, key, copy.deepcopy(value))
    for path, text in list(_interpolations(full, ())):  # a default is text as it is
        _set_path(full, path, text.replace("${", "\\${"))
    tree.merge(full, copy.deepcopy(values))
    unreadable = set()
    for path, text in found:
        try:
            OmegaConf.create({"value": text})  # the interpolation's grammar
        except Exception as e:
            problems.append(
                f"{_head(path, sources)}: {text!r} is not a valid interpolation ({first_line(e)}); write "
                "${oc.env:VAR}, ${oc.env:VAR,default} or ${section.key}, and \\${ for a literal ${"
            )
            unreadable.add(path)
            _set_path(full, path, None)
    try:
        conf = OmegaConf.create(full, flags={"allow_objects": True})
    except Exception as e:  # a key OmegaConf cannot hold
        problems.append(f"the config's interpolations could not be resolved: {first_line(e)}")
        return {}
    out: dict[str, Interpolated] = {}
    failed = set(unreadable)
    for path, text in found:
        if path in unreadable:
            continue
        try:
            node: Any = conf
            for part in path[:-1]:
                node = node[part]
            value = node[path[-1]]
            if OmegaConf.is_config(value):  # `${worker.reward.judge}`: a section
                value = OmegaConf.to_container(value, resolve=True)
        except Exception as e:
            problems.append(_interpolation_problem(path, text, e, full, sources))
            failed.add(path)
            continue
        _set_path(values, path, value)
        secrets = _secrets_read(text, path, full, conf, set())
        name = next((str(p) for p in reversed(path) if not isinstance(p, int)), "")  # a list item: the list's
        shown = str(hide_secrets(value, name))  # as config.yaml, --print-config and the trackers show it
        visible = [(what, env) for what, secret, env in secrets if secret in shown]
        leaked = sorted({what for what, env in visible if env} or {what for what, _ in visible})  # the origin
        if leaked:
            problems.append(
                f"{_head(path, sources)}: {text} puts the value of {' and '.join(leaked)} (a secret) under a "
                "key whose name does not mark a secret, so config.yaml, --print-config and the trackers would "
                "show it; set it under a key whose name ends in api_key, token, secret or password (those "
                f"are written as {MASK}), or let the code that needs it read the environment variable"
            )
        out[_dotted(path)] = Interpolated(text, any(secret in str(value) for _, secret, _ in secrets))
    for path in failed:  # said once: not again as a value of the wrong type (a list goes whole)
        key = path[: next((i for i, p in enumerate(path) if isinstance(p, int)), len(path))]
        if all(isinstance(p, str) for p in key):
            tree.pop(values, ".".join(key))
    return out


def _interpolations(value: Any, path: tuple) -> typing.Iterator[tuple[tuple, str]]:
    """(path, text) of every text in `value` with an interpolation (`${`)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _interpolations(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _interpolations(v, (*path, i))
    elif isinstance(value, str) and "${" in value:
        yield path, value


def _interpolation_problem(path: tuple, text: str, e: Exception, full: dict, sources: dict[str, str]) -> str:
    """What OmegaConf could not resolve at `path`, said with the key, where it was set and the way out."""
    head, why = f"{_head(path, sources)}: {text}", first_line(e)
    if m := re.search(r"Environment variable '([^']*)' not found", why):
        name = m.group(1)
        return (
            f"{head}: the environment variable {name} is not set; set it or give a default "
            f"${{oc.env:{name},default}}"
        )
    if m := re.search(r"Interpolation key '([^']*)' not found", why):
        ref = _absolute(m.group(1), path)
        keys = list(_keys(full))
        close = difflib.get_close_matches(ref, keys, n=1, cutoff=0.6)
        if not close:  # `${max_response_length}`: the right name in another section
            last = ref.rsplit(".", 1)[-1]
            close = [k for k in keys if k.rsplit(".", 1)[-1] == last][:1]
        hint = f"did you mean ${{{close[0]}}}?" if close else "a reference is ${section.key}, from the top"
        return f"{head}: {ref} is not a key of the config; {hint}"
    if "Recursive interpolation detected" in why:
        cycle = _cycle(_dotted(path), path, full)
        through = f" ({' -> '.join(cycle)})" if cycle else ""
        return f"{head}: the interpolations refer to each other in a cycle{through}; give one of them a value"
    if m := re.search(r"Unsupported interpolation type (\S+)", why):
        return (
            f"{head}: there is no resolver {m.group(1)}; rlstack resolves OmegaConf's own (oc.env, oc.decode, "
            f"oc.select, ...), {', '.join(RESOLVERS_OF_THE_SEEDS)} (NeMo RL's) and references ${{section.key}}"
        )
    return f"{head}: cannot be resolved: {why}"


def _secrets_read(
    text: str, path: tuple, full: dict, conf: Any, seen: set[str]
) -> list[tuple[str, str, bool]]:
    """(what, value, from the environment) of each secret `text` (at `path`) reads, through the keys it refers to: environment
    variables whose name marks a secret (`${oc.env:HF_TOKEN}`), and keys whose name does
    (`${worker.reward.judge.api_key}`)."""
    found = [(n, os.environ[n], True) for n in _ENV_NAME.findall(text) if is_secret(n) and os.environ.get(n)]
    for ref in _REFERENCE.findall(text):
        key = _absolute(ref, path)
        if key in seen:
            continue
        seen.add(key)
        if is_secret(key.rsplit(".", 1)[-1]):
            try:
                value = OmegaConf.select(conf, key, throw_on_resolution_failure=True)
            except Exception:  # said where that key is resolved
                value = None
            if isinstance(value, str) and value:
                found.append((key, value, False))
        for inner_path, inner in _interpolations(_lookup(full, key), tuple(_parts(key))):
            found += _secrets_read(inner, inner_path, full, conf, seen)
    return found


def _cycle(start: str, path: tuple, full: dict) -> list[str]:
    """`start -> a -> b -> start`: references from `start` (at `path`) that come back to it, else []."""

    def walk(key: str, at: tuple, chain: list[str]) -> list[str]:
        for inner_path, text in _interpolations(_lookup(full, key), at):
            for ref in _REFERENCE.findall(text):
                target = _absolute(ref, inner_path)
                if target == start:
                    return [*chain, target]
                found = (
                    []
                    if target in chain or len(chain) > 20
                    else walk(target, tuple(_parts(target)), [*chain, target])
                )
                if found:
                    return found
        return []

    return walk(start, path, [start])


def _absolute(ref: str, path: tuple) -> str:
    """A reference as a key from the top: `.n` and `..x.y` are relative to the key's section (`path`)."""
    ref = re.sub(r"\[(\w+)\]", r".\1", ref)
    dots = len(ref) - len(ref.lstrip("."))
    if not dots:
        return ref
    base = [str(p) for p in path[:-1]][: max(0, len(path) - dots)]
    return ".".join([*base, ref[dots:]])


def _parts(key: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in key.split(".")]


def _lookup(full: dict, key: str) -> Any:
    node: Any = full
    for part in _parts(key):
        if isinstance(node, dict) and (part in node or str(part) in node):
            node = node[part] if part in node else node[str(part)]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return None
    return node


def _keys(values: dict, prefix: str = "") -> typing.Iterator[str]:
    """Every key of `values`, sections included, dotted."""
    for k, v in values.items():
        yield f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _keys(v, f"{prefix}{k}.")


def _set_path(values: Any, path: tuple, value: Any) -> None:
    node = values
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


def _dotted(path: tuple) -> str:
    """`worker.rollout.agent.tools[0].api_key`."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def _head(path: tuple, sources: dict[str, str]) -> str:
    """`key (file, line N)`: the key and where it (or the list holding it) was set."""
    dicts = path[: next((i for i, p in enumerate(path) if isinstance(p, int)), len(path))]
    where = sources.get(".".join(map(str, dicts)), "")
    return f"{_dotted(path)} {tree.at(where)}".rstrip()


def first_line(e: Exception) -> str:
    """OmegaConf's message without the lines it adds (`full_key: ...`, `object_type=...`), on one line."""
    added = ("full_key:", "object_type=", "reference_type=", "parent_type=")
    return " ".join(x.strip() for x in str(e).splitlines() if x.strip() and not x.strip().startswith(added))


def decoded(text: str) -> Any:
    """Text an interpolation gave (an environment variable's), read as YAML reads a value: `2048` is a number."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text
