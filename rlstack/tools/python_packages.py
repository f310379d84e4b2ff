"""Where the sandboxed interpreter of `builtin:python` (`tools/python.py`) imports Pillow, NumPy and
Matplotlib from: the trainer's own site-packages, or a root-owned, world-readable copy of them when the
sandbox uid cannot read those."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

from rlstack.tools.base import ToolError

logger = logging.getLogger(__name__)

_PACKAGES = {"PIL": "pillow", "numpy": "numpy", "matplotlib": "matplotlib"}


@functools.cache
def _package_dirs() -> tuple[str, ...]:
    """Directories to put on the sandbox's `sys.path` so that Pillow, NumPy and Matplotlib import there.

    Normally the trainer's own site-packages. When the sandbox uid cannot read them (a virtual
    environment under a 0700 directory, e.g. a checkout in `mktemp -d`), a world-readable copy of
    those three distributions and their dependencies (`_readable_copy`) is used instead.
    """
    dirs: list[str] = []
    blocked = []
    for module, package in _PACKAGES.items():
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise ToolError(
                f"builtin:python needs {package} in the trainer's environment: pip install {package}"
            )
        package_dir = list(spec.submodule_search_locations)[0]
        if os.geteuid() == 0:  # the sandbox runs as another uid (rewards/sandbox/)
            reason = _not_world_readable(package_dir)
            if reason is not None:
                blocked.append(reason)
        site_dir = os.path.dirname(package_dir)
        if site_dir not in dirs:
            dirs.append(site_dir)
    if blocked:
        return (_readable_copy(tuple(_PACKAGES.values()), blocked[0]),)
    for path in sys.path:
        if path.endswith(("site-packages", "dist-packages")) and path not in dirs:
            dirs.append(path)
    return tuple(dirs)


def _readable_copy(packages: tuple[str, ...], why: str) -> str:
    """A root-owned, world-readable copy of `packages` and their dependencies (their installed files,
    from `importlib.metadata`), made once per machine and set of versions under the temp folder."""
    from importlib import metadata

    from packaging.requirements import Requirement

    dists: dict[str, metadata.Distribution] = {}
    todo = list(packages)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in dists:
            continue
        try:
            dist = dists[name] = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional dependency that is not installed
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
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
