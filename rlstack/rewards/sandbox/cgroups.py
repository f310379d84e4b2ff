"""A memory cgroup per run (`_Cgroup`): `memory_mb` over every process of the run and every page it
makes the kernel hold (memfd, POSIX shared memory, the files of its tmpfs root, kernel memory).

Where: the memory controller's hierarchy this process (a launcher) is in, cgroup v2 when it has the
memory controller, else cgroup v1's memory hierarchy; each run's cgroup is made under this
process's own cgroup (`rlstack-run-<launcher pid>-<n>`), so whatever limits the machine puts on the
trainer (a container's) still hold over its runs. P, the run's first process, joins it before it
does anything else (`child._child_setup`), so every process of the run, and every page they
charge, is counted there. The limit is `memory_mb` (v1: `memory.limit_in_bytes`, and
`memory.memsw.limit_in_bytes` where swap is accounted; v2: `memory.max`, `memory.swap.max` 0): past
it the kernel reclaims what it can (page cache) and then OOM-kills a process of the run, never one
outside it. A run whose cgroup saw an OOM kill (v2: or a refused charge) is `memory_limit`.

After the run (every process gone) its cgroup is removed; one that cannot be yet (a process still
exiting) is killed empty and removed, or retried at the next run's end; and a launcher's first run
removes what dead launchers left behind. So no cgroup outlives its run by much, over any number of
runs.

Where no hierarchy can be used (not root and no delegated cgroup, cgroup v2 whose cgroup has
processes of its own, no memory controller), `problem()` says why and runs get no cgroup: the
sandbox then refuses `memfd_create` (seccomp) and memory is bounded per process (RLIMIT_AS) and by
the process count and the disk budget (see `probe.weaker_limits`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
import threading
import time
from dataclasses import dataclass

from rlstack.rewards.sandbox.processes import _kill_all

_PREFIX = "rlstack-run-"
_counter = itertools.count()
_leftovers: list[str] = []
"""Cgroups of ended runs that could not be removed yet (retried at each run's end)."""
_leftovers_lock = threading.Lock()


@dataclass(frozen=True)
class _Hierarchy:
    version: int
    """1 or 2."""
    parent: str
    """This process's own cgroup (a directory of the mounted hierarchy): where runs' cgroups are made."""
    swap: bool
    """Whether swap is accounted (v1 `memory.memsw.*`, v2 `memory.swap.max`): the run may not swap past its limit."""


def problem() -> str | None:
    """Why runs get no memory cgroup here, or None."""
    found = _hierarchy()
    return found if isinstance(found, str) else None


@functools.cache
def _hierarchy() -> _Hierarchy | str:
    """Where runs' cgroups are made, or why none can be (tried once, with a cgroup made and removed)."""
    try:
        with open("/proc/self/cgroup") as f:
            own = f.read().splitlines()
        with open("/proc/self/mountinfo") as f:
            mounts = f.read().splitlines()
    except OSError as e:
        return f"cannot read this process's cgroups ({e})"
    v1_path = v2_path = None
    for line in own:
        number, controllers, path = line.split(":", 2)
        if number == "0" and controllers == "":
            v2_path = path
        elif "memory" in controllers.split(","):
            v1_path = path
    reasons = []
    for version, path in ((2, v2_path), (1, v1_path)):
        if path is None:
            continue
        directory = _directory(mounts, version, path)
        if directory is None:
            continue
        found = _usable(version, directory)
        if isinstance(found, _Hierarchy):
            _sweep(found.parent)
            return found
        reasons.append(found)
    if not reasons:
        return "this machine has no memory cgroup controller mounted (cgroup v2 with `memory`, or cgroup v1's memory hierarchy)"
    return "; ".join(reasons)


def _directory(mounts: list[str], version: int, path: str) -> str | None:
    """The directory of cgroup `path` in the mounted hierarchy of `version` (None: not mounted here)."""
    for line in mounts:
        fields = line.split()
        try:
            dash = fields.index("-")
            fstype, options = fields[dash + 1], fields[dash + 3]
        except (ValueError, IndexError):
            continue
        if version == 2 and fstype != "cgroup2":
            continue
        if version == 1 and (fstype != "cgroup" or "memory" not in options.split(",")):
            continue
        root, point = _unescape(fields[3]), _unescape(fields[4])
        if path == root or path.startswith(root.rstrip("/") + "/"):
            return os.path.normpath(os.path.join(point, os.path.relpath(path, root)))
    return None


def _unescape(field: str) -> str:
    """A path of /proc/self/mountinfo (spaces and the like are written as octal escapes)."""
    if "\\" not in field:
        return field
    return os.fsdecode(field.encode().decode("unicode_escape").encode("latin-1"))


def _usable(version: int, parent: str) -> _Hierarchy | str:
    """A hierarchy made of `parent` if a run's cgroup can be made under it, else why not."""
    where = f"cgroup v{version} at {parent}"
    if version == 2:
        try:
            with open(os.path.join(parent, "cgroup.controllers")) as f:
                if "memory" not in f.read().split():
                    return f"{where} has no memory controller"
            with open(os.path.join(parent, "cgroup.subtree_control")) as f:
                enabled = f.read().split()
            if "memory" not in enabled:
                with open(os.path.join(parent, "cgroup.subtree_control"), "w") as f:
                    f.write("+memory")
        except OSError as e:
            why = (
                " (cgroup v2 gives a memory controller to the children of a cgroup only when it has no "
                "processes of its own: run the trainer in a leaf of a delegated cgroup whose parent has memory enabled)"
                if e.errno == errno.EBUSY
                else ""
            )
            return f"{where}: cannot enable the memory controller for runs ({e}){why}"
        swap = os.path.exists(os.path.join(parent, "memory.swap.max"))
    else:
        swap = os.path.exists(os.path.join(parent, "memory.memsw.limit_in_bytes"))
    found = _Hierarchy(version, parent, swap)
    try:
        trial = _Cgroup.new(found, 64)
    except OSError as e:
        return f"{where}: cannot make a cgroup for a run there ({e})"
    trial.remove()
    return found


def _sweep(parent: str) -> None:
    """Remove the runs' cgroups that launchers which are gone left behind (empty ones only)."""
    with contextlib.suppress(OSError):
        for entry in os.listdir(parent):
            if not entry.startswith(_PREFIX):
                continue
            try:
                pid = int(entry[len(_PREFIX) :].split("-")[0])
                os.kill(pid, 0)
            except ValueError:
                continue
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(parent, entry))
            except PermissionError:
                pass


def new(memory_mb: int) -> _Cgroup | None:
    """A fresh cgroup for a run, limited to `memory_mb` MiB; None where the machine gives none
    (`problem()`). Raises `OSError` where one could be made before but not now."""
    found = _hierarchy()
    return None if isinstance(found, str) else _Cgroup.new(found, memory_mb)


class _Cgroup:
    """One run's cgroup: made, joined by P (`join`), read for OOM kills, emptied and removed."""

    def __init__(self, path: str, version: int) -> None:
        self.path = path
        self.version = version

    @classmethod
    def new(cls, hierarchy: _Hierarchy, memory_mb: int) -> _Cgroup:
        while True:  # the token: a cgroup a dead launcher of the same pid left behind is not this one's
            path = os.path.join(hierarchy.parent, f"{_PREFIX}{os.getpid()}-{_token()}-{next(_counter)}")
            try:
                os.mkdir(path, 0o755)
                break
            except FileExistsError:
                continue
        cgroup = cls(path, hierarchy.version)
        limit = str(memory_mb << 20)
        try:
            if hierarchy.version == 2:
                cgroup._write("memory.max", limit)
                if hierarchy.swap:
                    cgroup._write("memory.swap.max", "0")
            else:
                cgroup._write("memory.limit_in_bytes", limit)
                if hierarchy.swap:
                    cgroup._write("memory.memsw.limit_in_bytes", limit)
        except BaseException:
            cgroup.remove()
            raise
        return cgroup

    @property
    def join(self) -> str:
        """The file P writes "0" to, first thing, to join the cgroup. v1: `tasks`, which moves only the
        writing thread (P has no other) and, for "0", without the kernel's global threadgroup lock,
        whose taking costs a whole RCU grace period (~10 ms a run here); v2: `cgroup.procs`."""
        return os.path.join(self.path, "tasks" if self.version == 1 else "cgroup.procs")

    def out_of_memory(self) -> bool:
        """Whether the kernel OOM-killed a process of the run (v2: or refused it memory at its limit)."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            with open(os.path.join(self.path, name)) as f:
                counts = dict(line.split() for line in f.read().splitlines() if line.strip())
        except (OSError, ValueError):
            return False
        keys = ("oom_kill", "oom") if self.version == 2 else ("oom_kill",)
        return any(int(counts.get(key, 0)) > 0 for key in keys)

    def processes(self) -> list[int]:
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                return [int(pid) for pid in f.read().split()]
        except OSError:
            return []

    def remove(self) -> None:
        """Remove the cgroup once its processes are gone (killing any left); one that still cannot be
        removed is kept for a later try (at the next run's end)."""
        with _leftovers_lock:
            pending, _leftovers[:] = [*_leftovers, self.path], []
        for path in pending:  # an older leftover gets one try, so that none slows every run's end down
            if not _remove(path, self, 20 if path == self.path else 1):
                with _leftovers_lock:
                    _leftovers.append(path)

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)


def _remove(path: str, cgroup: _Cgroup, attempts: int) -> bool:
    """rmdir `path`; when busy, kill what is in it and try again, `attempts` times in all. Whether it is gone."""
    for attempt in range(attempts):
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as e:
            if e.errno != errno.EBUSY:
                return False
        if attempt == 0:
            other = _Cgroup(path, cgroup.version)
            _kill_all(other.processes)
        if attempt + 1 < attempts:
            time.sleep(0.001 * (attempt + 1))
    return False


@functools.cache
def _token() -> str:
    """A random token of this process (a launcher), in its runs' cgroup names."""
    return os.urandom(4).hex()
