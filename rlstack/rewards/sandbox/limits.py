"""What a sandboxed run may use (`SandboxLimits`), what comes back (`SandboxResult`), and how a
finished run's exit is classified (`_classify`: `ok`, `time_limit`, `memory_limit`, ...)."""

from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass
from typing import NamedTuple

_SETUP_FAILED = "rlstack sandbox: setting up the run failed: "
_SETUP_EXIT = 125


class SandboxLimits(NamedTuple):
    wall_s: float = 10.0
    """Wall-clock seconds before the whole process group is killed (status `time_limit`)."""
    cpu_s: float = 10.0
    """CPU seconds (RLIMIT_CPU, rounded up to whole seconds) before SIGXCPU (status `time_limit`)."""
    memory_mb: int = 1024
    """MiB of memory, in two ways. For the whole run: its memory cgroup's limit, covering every process
    of it and every page it makes the kernel hold (memfd, POSIX shared memory, its files on the tmpfs
    root: so files count in both `disk_mb` and here), the interpreter included (~5 MiB bare); past it the
    kernel OOM-kills a process of the run and the run is `memory_limit`, even if the program exits 0.
    And per process: its address space (RLIMIT_AS), so that a big allocation raises MemoryError
    (status `memory_limit`). Where the machine gives no cgroup (see module docstring; said once),
    only the per-process limit holds, and `memfd_create` is refused."""
    file_size_mb: int = 64
    """Largest file the program may write (RLIMIT_FSIZE) in MiB; past it the program gets SIGXFSZ."""
    max_processes: int = 32
    """Processes and threads the program may have at once (RLIMIT_NPROC: counted for its own uid, or in
    its own user namespace when the caller is not root; see module). No pids cgroup on top: the uid
    or the user namespace is the run's alone, so this already bounds the run."""
    max_output_bytes: int = 1 << 20
    """Cap on each of stdout and stderr; past it the run is killed (status `output_limit`)."""
    disk_mb: int = 128
    """Total MiB (and at most 16384 files) of everything the program writes: its root is one tmpfs holding
    the work dir, /tmp, /var/tmp and /dev/shm; past it writes fail with ENOSPC (status `disk_limit`).
    Those pages are memory, so they count in the run's `memory_mb` too (where it has a cgroup)."""


DEFAULT_LIMITS = SandboxLimits()


@dataclass
class SandboxResult:
    status: str
    """`ok`, `runtime_error`, `time_limit`, `memory_limit`, `disk_limit`, `output_limit` or `sandbox_error`."""
    exit_code: int | None
    """The program's exit status; negative: killed by that signal; None: it never ran."""
    stdout: str
    stderr: str
    error_line: str
    """For errors: the last line of the traceback, the signal, or what went wrong in the sandbox."""
    wall_s: float
    network: str
    """How the network was cut off: `namespace` (an empty network namespace) or `remote` (SandboxFusion)."""
    uid: int | None
    """The unprivileged uid the program ran under; None when it had no uid of its own (the caller is
    not root: a user namespace of its own instead) or did not run here (SandboxFusion)."""
    scratch: str
    """Where its files were: `private` (its own tmpfs of `disk_mb`) or `remote` (SandboxFusion)."""


def _classify(
    returncode: int, stderr: str, killed_for: str | None, limits: SandboxLimits, out_of_memory: bool = False
) -> tuple[str, str]:
    """(status, error line) of a finished run; ENOSPC means the run's own disk budget. `out_of_memory`:
    the run's memory cgroup OOM-killed one of its processes or refused it memory (whichever process
    it was, and however the program itself ended)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    if returncode == _SETUP_EXIT and stderr.startswith(_SETUP_FAILED):
        return "sandbox_error", stderr.strip()
    if out_of_memory:
        why = last if last.startswith("MemoryError") or "Cannot allocate memory" in last else ""
        return "memory_limit", (
            f"memory limit of {limits.memory_mb} MiB for the whole run exceeded (every process, memfd, "
            f"shared memory and file of the run counts): a process of the run was killed or refused memory"
            + (f" ({why})" if why else "")
        )
    if killed_for == "time_limit":
        return "time_limit", f"wall-clock limit of {limits.wall_s:g}s exceeded"
    if killed_for == "output_limit":
        return "output_limit", f"output over {limits.max_output_bytes} bytes"
    if returncode == 0:
        return "ok", ""
    if returncode < 0:
        sig = -returncode
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            return "time_limit", f"CPU limit of {math.ceil(limits.cpu_s)}s exceeded ({signal_name(sig)})"
        if sig == signal.SIGXFSZ:
            return "runtime_error", f"file size limit of {limits.file_size_mb} MiB exceeded (SIGXFSZ)"
        return "runtime_error", f"killed by {signal_name(sig)}"
    if last.startswith("MemoryError") or "Cannot allocate memory" in last:
        return "memory_limit", last
    if is_disk_full(last):
        return "disk_limit", f"disk budget of {limits.disk_mb} MiB exceeded ({last})"
    return "runtime_error", last or f"exit status {returncode}"


def signal_name(number: int) -> str:
    """A signal's name (`SIGKILL`), or `signal 40` for one Python's enum does not name (a real-time
    signal: a program may kill itself with any)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def is_disk_full(error: str) -> bool:
    """Whether an error line (a traceback's last line) is ENOSPC: the run's disk budget."""
    return "No space left on device" in error or "[Errno 28]" in error


def _failed(why: str, start: float) -> SandboxResult:
    return SandboxResult(
        "sandbox_error", None, "", "", why, time.monotonic() - start, "namespace", None, "private"
    )
