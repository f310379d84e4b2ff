"""Whether the sandbox can run here (`isolation_problem`: one probe run, in a launcher) and which
interpreter the sandbox uid can execute (`_interpreter`).

There is no weaker fallback: where the namespaces cannot be made (not root and no unprivileged
user namespaces; a container without CAP_SYS_ADMIN or whose seccomp profile forbids
`unshare`/`mount`), `isolation_problem()` (a probe run, in a launcher) says so with the fix, config validation refuses `builtin:code` with `sandbox=local` and `builtin:python`
at load, and a run that gets here anyway returns `sandbox_error`.

The interpreter must be one the sandbox uid can run: `sys.executable` when every directory from
its prefix down is world-searchable, else the first `python3` on the sandbox PATH.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import stat
import subprocess
import sys

from rlstack.rewards import launcher
from rlstack.rewards.sandbox import cgroups
from rlstack.rewards.sandbox.child import MAX_FILES
from rlstack.rewards.sandbox.kernel import _MACHINE
from rlstack.rewards.sandbox.limits import DEFAULT_LIMITS
from rlstack.rewards.sandbox.processes import _kill_group
from rlstack.rewards.sandbox.runs import _SANDBOX_PATH, _start

_log = logging.getLogger("rlstack.rewards.sandbox")
_ISOLATION_FIX = (
    "The local sandbox gives each run new network, IPC, PID and mount namespaces (a root of its own "
    "holding only the interpreter, its libraries and the run's scratch space) and a uid of its own "
    "(as root) or a user namespace of its own (not root). Fix: run the trainer as root, or allow "
    "unprivileged user namespaces (sysctl user.max_user_namespaces above 0; kernel.unprivileged_userns_clone=1 "
    "where that setting exists; kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu 24.04 and later); "
    "in a container, give it CAP_SYS_ADMIN or a seccomp profile that allows unshare and mount; or run "
    "programs elsewhere with worker.reward.code.sandbox=fusion and a SandboxFusion server."
)


def isolation_problem() -> str | None:
    """Why the sandbox cannot run here (with the fix), or None: probed once by a full run, in a
    launcher (a probe is a sandboxed run: it is never started from the caller either). A launcher
    that could not be had is not remembered: the next call tries again.

    There is no weaker fallback: without every namespace, nothing runs.
    """
    try:
        return _isolation_problem()
    except launcher.LauncherError as e:
        return f"no launcher process could be started to run it ({e})"


@functools.cache
def _isolation_problem() -> str | None:
    if launcher.IN_LAUNCHER:
        return _probe()
    problem, weaker = launcher.pool().ask(("probe",))
    if problem is None and weaker:
        _log.warning("%s", weaker)
    return problem


def weaker_limits() -> str | None:
    """What this machine cannot give a run (said once, when a caller first probes the sandbox), or None.

    Without a memory cgroup (`cgroups.problem()`): `memory_mb` bounds each process (RLIMIT_AS), not
    the run; a run's processes together may hold up to `max_processes` x `memory_mb`, plus `disk_mb`
    of files, plus the buffers of `MAX_FILES` descriptors a process (RLIMIT_NOFILE); `memfd_create` is refused.
    """
    said = []
    why = cgroups.problem()
    if why is not None:
        said.append(
            f"no memory cgroup for sandbox runs ({why}): memory_mb limits each process of a run (RLIMIT_AS) "
            "but not the run as a whole, so a run's processes together may hold up to max_processes x "
            f"memory_mb, plus disk_mb of files, plus the kernel buffers of up to {MAX_FILES} pipes or sockets "
            "a process; memfd_create is refused in runs"
        )
    return "rlstack sandbox: " + "; ".join(said) + "." if said else None


def _probe() -> str | None:
    """`isolation_problem` in a launcher: one empty program through the whole set-up."""
    if _MACHINE is None:
        return f"this machine's architecture ({os.uname().machine}) is not one the sandbox supports (x86_64, aarch64)"
    python = _interpreter()
    if python is None:
        return "no Python interpreter the sandbox uid can execute"
    who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}, in a user namespace of its own"
    try:
        proc, run = _start(python, "", {}, DEFAULT_LIMITS, (), subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return f"a test run ({who}) failed ({type(e).__name__}: {e}). {_ISOLATION_FIX}"
    try:
        _, stderr = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        proc.wait()
        return f"a test run ({who}) did not end within 30 s. {_ISOLATION_FIX}"
    finally:
        run.release(gone=run.ended(proc))
    if proc.returncode != 0:
        why = stderr.decode(errors="replace").strip()[-500:] or f"exit status {proc.returncode}"
        return f"a test run ({who}) failed ({why}). {_ISOLATION_FIX}"
    return None


@functools.cache
def _interpreter() -> str | None:
    candidates = [os.path.realpath(sys.executable)]
    which = shutil.which("python3", path=_SANDBOX_PATH)
    if which:
        candidates.append(os.path.realpath(which))
    if os.geteuid() != 0:
        return candidates[0]
    for path in candidates:
        if _world_executable(path):
            return path
    return None


def _world_executable(path: str) -> bool:
    """Whether any uid can exec `path` and read its standard library: every directory from the
    interpreter's prefix down is o+x (the prefix is bound into the run's root at its own path, under
    directories of the root's own, so what lies above it does not matter)."""
    prefix = os.path.dirname(os.path.dirname(path))
    start = len(prefix.split(os.sep))
    lib = os.path.join(prefix, "lib")
    for p in (path, lib):
        parts = p.split(os.sep)
        for i in range(start, len(parts) + 1):
            mode = os.stat(os.sep.join(parts[:i]) or os.sep).st_mode
            if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
                return False
    return bool(os.stat(path).st_mode & stat.S_IXOTH)
