"""Running untrusted Python (model-written code, later the agent's Python tool) without harming the trainer.

Every run is a fresh `python -I -S -B main.py` subprocess, never the calling process, started by a
small launcher process rather than by the caller (`run_python`; see `rlstack/rewards/launcher.py`:
forking a trainer that holds a model is slow, and a CUDA context must not be forked), in its own
session and process group, in a fresh temporary directory that is removed afterwards, with a scrubbed
environment (PATH, LANG, PYTHONHASHSEED, HOME=the work dir: nothing of the parent's, so no secrets).

Isolation, in the order `preexec_fn` applies it in the child before `exec`:

- **Network.** `unshare(CLONE_NEWNET)` (via libc; `os.unshare` is 3.12+) puts the child in an empty
  network namespace: no interfaces but a loopback that is down, so even 127.0.0.1 is unreachable.
  Where the kernel refuses (not root, no CAP_SYS_ADMIN), a prelude replaces `socket.socket` with one
  that raises; that only stops ordinary Python code (ctypes can still make syscalls), and the result
  says which of the two was used (`network`: `namespace` or `blocked`).
- **Private scratch space.** `unshare(CLONE_NEWNS)` gives the child a mount namespace of its own
  (mounts made private first, so nothing propagates back to the machine), and one tmpfs of
  `disk_mb` MiB (and at most 16384 files) is mounted there. Its subdirectories are bind-mounted over
  the world-writable `/tmp`, `/var/tmp`, `/dev/shm` and `/run/lock` (those that exist), and the work
  dir is created inside that private `/tmp` at the same path the trainer reserved for it, with the
  run's files written into it before `exec`. So the work dir and every scratch directory share one
  budget: writing past it fails with ENOSPC (`OSError: [Errno 28] No space left on device`), which
  the result reports as status `disk_limit` naming the budget. Nothing the program writes is seen by
  the machine or by any other run, even while it runs, and it all goes away with the namespace when
  the run's last process dies. Directories under those paths the program needs (the interpreter's
  prefix, the Python tool's packages) are bind-mounted back read-only. Where the kernel refuses
  (not root, no CAP_SYS_ADMIN, a seccomp profile that forbids `mount`), scratch is `shared`: the work
  dir is an ordinary temporary directory, TMPDIR points into it, the program can still write to the
  machine's world-writable directories while it runs (files there are visible to other uids), those
  files are removed after the run (root only: they are found by uid), and `disk_mb` is not enforced,
  only the per-file `file_size_mb`. The result says which was used (`scratch`: `private` or `shared`).
  The tmpfs is memory: a run holds at most `memory_mb` + `disk_mb` MiB of RAM.
- **Limits.** `setrlimit` of CPU time (SIGXCPU at `cpu_s`, SIGKILL a second later), address space,
  file size (SIGXFSZ), process count, and no core files.
- **Unprivileged uid.** When the trainer runs as root, the child drops to a uid of its own
  (`_UID_BASE` + random, no passwd entry needed; supplementary groups cleared). This is what makes
  the process limit work (RLIMIT_NPROC counts the processes of the real uid and is ignored for
  root), takes away every capability (a sandboxed program cannot signal the trainer, read its
  `/proc/<pid>/environ`, or write to root-owned places), and marks every process of the run, so
  that after the run all processes of that uid are killed, including a double-forked daemon that
  left the process group with `setsid`. Files it left in the world-writable `/tmp`, `/var/tmp`,
  `/dev/shm` and `/run/lock` are removed too (where scratch is `shared`, above). Not root: no uid switch, the process
  group is the only handle. (cgroup v1 is mounted read-only-in-practice in containers; we do not use
  cgroups.)

The interpreter must be reachable by that uid: `sys.executable` when every directory on its path is
world-searchable, else the first `python3` on the sandbox PATH (e.g. pyenv under a 0700 `/root`
falls back to `/usr/bin/python3`).

The wall-clock limit kills the whole process group (SIGKILL, so ignoring SIGTERM does not help),
then every process of the uid. stdout/stderr are read incrementally and the run is killed once
either passes `max_output_bytes`.

`SandboxProcess` is the long-lived form (the agent's Python interpreter tool): the same isolation and
clean-up, but the program keeps running between exchanges and talks to its parent over its stdin and
stdout pipes; stderr is its console. Its CPU limit is a budget for its whole life; wall-clock and
output limits are per exchange, so they are the caller's to enforce.

`preexec_fn` runs in the forked child of a possibly multi-threaded trainer, so it only makes plain
system calls (`os.*`, libc's `unshare` and `mount` via ctypes; libc is loaded once, in the parent, at
import) and imports nothing: paths and file contents are prepared in the parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import math
import os
import random
import resource
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from rlstack.rewards import launcher

_CLONE_NEWNET = 0x40000000
_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x20, 0x1000, 0x4000, 0x40000
_MS_RDONLY = 0x1
_SCRATCH_INODES = 16384
_PAGE = 4096
_UID_BASE = 200_000
_UID_RANGE = 60_000
_SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
_WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
_READ_CHUNK = 1 << 16

_PRELUDE_NAME = "_prelude.py"
_SOCKET_PRELUDE = """\
import runpy, socket, _socket, sys

def _refuse(*args, **kwargs):
    raise PermissionError("network access is disabled in the sandbox")

class _NoSocket(_socket.socket):
    def __init__(self, *args, **kwargs):
        _refuse()

socket.socket = socket.SocketType = _socket.socket = _NoSocket
socket.create_connection = socket.socketpair = socket.fromfd = socket.getaddrinfo = _refuse
sys.argv = [{script!r}]
runpy.run_path({script!r}, run_name="__main__")
"""
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


class SandboxLimits(NamedTuple):
    wall_s: float = 10.0
    """Wall-clock seconds before the whole process group is killed (status `time_limit`)."""
    cpu_s: float = 10.0
    """CPU seconds (RLIMIT_CPU, rounded up to whole seconds) before SIGXCPU (status `time_limit`)."""
    memory_mb: int = 1024
    """Address space (RLIMIT_AS) in MiB; allocating past it raises MemoryError (status `memory_limit`)."""
    file_size_mb: int = 64
    """Largest file the program may write (RLIMIT_FSIZE) in MiB; past it the program gets SIGXFSZ."""
    max_processes: int = 32
    """Processes and threads the program's uid may have at once (RLIMIT_NPROC; root only: see module)."""
    max_output_bytes: int = 1 << 20
    """Cap on each of stdout and stderr; past it the run is killed (status `output_limit`)."""
    disk_mb: int = 128
    """Total MiB (and at most 16384 files) of the work dir, /tmp, /var/tmp, /dev/shm (one private tmpfs);
    past it writes fail with ENOSPC (status `disk_limit`). Enforced only where scratch is `private`."""


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
    """How the network was cut off: `namespace` (empty network namespace) or `blocked` (socket layer)."""
    uid: int | None
    """The unprivileged uid the program ran under; None when the trainer is not root."""
    scratch: str
    """Where its work dir and /tmp, /dev/shm were: `private` (own tmpfs, `disk_mb`), `shared` (the
    machine's, cleaned after the run) or `remote` (SandboxFusion)."""


def run_python(
    code: str,
    stdin: str = "",
    limits: SandboxLimits = DEFAULT_LIMITS,
    files: dict[str, bytes] | None = None,
) -> SandboxResult:
    """Run `code` as `main.py` in a fresh sandbox (see module docstring) and return what happened.

    The run is started by a small launcher process (`rlstack.rewards.launcher`), not by the caller,
    so that a trainer holding a model is never forked; where no launcher can run it, it starts here.
    """
    try:
        return launcher.pool().run((code, stdin, limits, files))
    except launcher.LauncherError:
        return run_python_here(code, stdin, limits, files)


def run_python_here(
    code: str,
    stdin: str = "",
    limits: SandboxLimits = DEFAULT_LIMITS,
    files: dict[str, bytes] | None = None,
) -> SandboxResult:
    """`run_python`, started from this process."""
    start = time.monotonic()
    network = "namespace" if _netns_available() else "blocked"
    scratch = "private" if _scratch_available() else "shared"
    python = _interpreter()
    if python is None:
        return _failed("no Python interpreter the sandbox uid can execute", network, scratch, start)
    uid = _allocate_uid() if os.geteuid() == 0 else None
    workdir = _new_workdir(scratch)
    try:
        private = _stage(
            workdir, {**(files or {}), "main.py": code.encode()}, limits, network, uid, scratch, python, ()
        )
        with tempfile.TemporaryFile() as stdin_file:
            stdin_file.write(stdin.encode())
            stdin_file.seek(0)
            proc = _spawn(python, workdir, stdin_file, limits, uid, network, private)
            return _run(proc, limits, uid, network, scratch, start)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return _failed(f"{type(e).__name__}: {e}", network, scratch, start)
    finally:
        _release_run(uid, workdir, scratch)


def _release_run(uid: int | None, workdir: str, scratch: str) -> None:
    """After a run: kill what is left of the uid, remove its files and the work dir, free the uid.

    With private scratch the program's files went away with its mount namespace when its last
    process died; `workdir` is then the empty directory its tmpfs was mounted on.
    """
    if uid is not None:
        _kill_uid(uid)
        if scratch == "shared":
            _remove_uid_files(uid)
        _release_uid(uid)
    shutil.rmtree(workdir, ignore_errors=True)


def _run(proc: subprocess.Popen, limits: SandboxLimits, uid, network, scratch, start) -> SandboxResult:
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    killed_for = _watch(proc.pid, bufs, limits, start)
    # Kill before reaping: the unreaped child keeps its process group id from being reused.
    _kill_group(proc.pid)
    if uid is not None:
        _kill_uid(uid)
    stdout, stderr = _drain(bufs, limits.max_output_bytes)
    proc.stdout.close()
    proc.stderr.close()
    proc.wait()
    wall_s = time.monotonic() - start
    out = stdout.decode(errors="replace")
    err = stderr.decode(errors="replace")
    status, error_line = _classify(proc.returncode, err, killed_for, limits, scratch == "private")
    return SandboxResult(status, proc.returncode, out, err, error_line, wall_s, network, uid, scratch)


@dataclass(frozen=True)
class _Scratch:
    """What the child needs to set up its private scratch space (`_mount_scratch`), prepared in the parent."""

    workdir: str
    """The work dir: an empty root-only directory under the machine's /tmp (the tmpfs's mount point),
    made again, at the same path, inside the private /tmp."""
    payload: dict[str, bytes]
    """Files to write into the work dir (names already checked to stay inside it)."""
    disk_mb: int
    """Size of the tmpfs: the budget for the work dir and every scratch directory together."""
    dirs: tuple[str, ...]
    """The world-writable directories to cover with the tmpfs."""
    read_only: tuple[str, ...]
    """Directories under them to bind back, read-only (the interpreter's prefix, the tool's packages)."""


def _new_workdir(scratch: str) -> str:
    """A fresh, root-only work dir; with private scratch directly under /tmp (see `_Scratch.workdir`)."""
    return tempfile.mkdtemp(
        prefix="rlstack-sandbox-", dir=_scratch_dirs()[0] if scratch == "private" else None
    )


def _stage(
    workdir: str,
    files: dict[str, bytes],
    limits: SandboxLimits,
    network: str,
    uid: int | None,
    scratch: str,
    python: str,
    read_only: tuple[str, ...],
) -> _Scratch | None:
    """Check the run's files; write them now (shared scratch) or describe them for the child (private),
    with `python`'s prefix and `read_only` bound back where they lie under a scratch directory.

    Raises ValueError for a file outside the work dir or files larger than the disk budget.
    """
    payload = _payload(workdir, files, network)
    if scratch == "shared":
        _write_files(workdir, payload, uid)
        return None
    size = sum(-(-len(data) // _PAGE) * _PAGE for data in payload.values())
    if size > limits.disk_mb << 20:
        raise ValueError(
            f"the sandbox's files ({size / (1 << 20):.1f} MiB) do not fit its disk budget of "
            f"{limits.disk_mb} MiB (SandboxLimits.disk_mb)"
        )
    exposed = _under_scratch((os.path.dirname(os.path.dirname(python)), *read_only))
    return _Scratch(workdir, payload, limits.disk_mb, _scratch_dirs(), exposed)


def _spawn(
    python: str,
    workdir: str,
    stdin,
    limits: SandboxLimits,
    uid: int | None,
    network: str,
    private: _Scratch | None,
) -> subprocess.Popen:
    """Start `main.py` (in `workdir`, or in `private`'s payload) under the sandbox; stdout and stderr are pipes."""
    env = {
        "PATH": _SANDBOX_PATH,
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONIOENCODING": "utf-8",
        "HOME": workdir,
        "TMPDIR": workdir,
    }
    return subprocess.Popen(
        [python, "-I", "-S", "-B", "main.py" if network == "namespace" else _PRELUDE_NAME],
        cwd=workdir,
        env=env,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
        preexec_fn=functools.partial(_child_setup, limits, uid, network == "namespace", private),
    )


class SandboxProcess:
    """A long-lived program in the sandbox that talks to its parent over pipes (see module docstring).

    `stdin` / `stdout` are the parent's ends of the program's stdin and stdout (a protocol of the
    caller's choosing), `stderr` the read end of its console. `read_only`: directories the program
    reads from (e.g. packages it imports) that must stay visible when they lie under /tmp. Raises
    `OSError` (or `ValueError` for a file name outside the work dir, or files past `disk_mb`) when it
    cannot start; everything is cleaned up by then. `close()` kills every process of the run and
    removes its files; it also runs when the object is garbage-collected or the trainer exits, so a
    forgotten close leaves nothing behind for long.
    """

    def __init__(
        self, script: str, files: dict[str, bytes], limits: SandboxLimits, read_only: tuple[str, ...] = ()
    ) -> None:
        self.network = "namespace" if _netns_available() else "blocked"
        self.scratch = "private" if _scratch_available() else "shared"
        python = _interpreter()
        if python is None:
            raise OSError("no Python interpreter the sandbox uid can execute")
        self.uid = _allocate_uid() if os.geteuid() == 0 else None
        self.workdir = _new_workdir(self.scratch)
        try:
            files = {**files, "main.py": script.encode()}
            private = _stage(
                self.workdir, files, limits, self.network, self.uid, self.scratch, python, read_only
            )
            proc = _spawn(python, self.workdir, subprocess.PIPE, limits, self.uid, self.network, private)
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            _release_run(self.uid, self.workdir, self.scratch)
            if isinstance(e, ValueError):
                raise
            raise OSError(f"starting the sandboxed process failed: {type(e).__name__}: {e}") from e
        self._proc = proc
        self.pid = proc.pid
        self.stdin, self.stdout, self.stderr = proc.stdin, proc.stdout, proc.stderr
        self._finalizer = weakref.finalize(self, _end_process, proc, self.uid, self.workdir, self.scratch)

    def poll(self) -> int | None:
        """The exit status once the program has exited (negative: killed by that signal), else None."""
        return self._proc.poll()

    def kill_strays(self) -> None:
        """Kill every process of the run except the program itself (children it left running)."""
        if self.uid is not None:
            _kill_all(lambda: [p for p in processes_of_uid(self.uid) if p != self.pid])
        else:
            _kill_all(lambda: [p for p in _processes_in_group(self.pid) if p != self.pid])

    def close(self) -> int | None:
        """Kill the program and everything of its run, remove its files; its exit status (idempotent)."""
        self._finalizer()
        return self._proc.returncode


def _end_process(proc: subprocess.Popen, uid: int | None, workdir: str, scratch: str) -> None:
    _kill_group(proc.pid)
    if uid is not None:
        _kill_uid(uid)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        with contextlib.suppress(OSError):
            pipe.close()
    proc.wait()
    _release_run(uid, workdir, scratch)


def _watch(pid: int, bufs: dict[int, bytearray], limits: SandboxLimits, start: float) -> str | None:
    """Read output into `bufs` until the program exits; `time_limit` / `output_limit` when it was stopped."""
    sel = selectors.DefaultSelector()
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    pidfd = os.pidfd_open(pid)
    sel.register(pidfd, selectors.EVENT_READ)
    deadline = start + limits.wall_s
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "time_limit"
            for key, _ in sel.select(remaining):
                if key.fd == pidfd:
                    return None
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                buf = bufs[key.fd]
                buf += chunk
                if len(buf) > limits.max_output_bytes:
                    return "output_limit"
    finally:
        sel.close()
        os.close(pidfd)


def _drain(bufs: dict[int, bytearray], cap: int) -> tuple[bytes, bytes]:
    """What is left in the pipes (every writer is dead by now), each stream cut to `cap` bytes."""
    for fd, buf in bufs.items():
        while len(buf) <= cap:
            try:
                chunk = os.read(fd, _READ_CHUNK)
            except BlockingIOError:
                break
            if not chunk:
                break
            buf += chunk
    out, err = bufs.values()
    return bytes(out[:cap]), bytes(err[:cap])


def _classify(
    returncode: int, stderr: str, killed_for: str | None, limits: SandboxLimits, private_scratch: bool = False
) -> tuple[str, str]:
    """(status, error line) of a finished run; `private_scratch`: ENOSPC means the run's own disk budget."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    if killed_for == "time_limit":
        return "time_limit", f"wall-clock limit of {limits.wall_s:g}s exceeded"
    if killed_for == "output_limit":
        return "output_limit", f"output over {limits.max_output_bytes} bytes"
    if returncode == 0:
        return "ok", ""
    if returncode < 0:
        sig = signal.Signals(-returncode)
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            return "time_limit", f"CPU limit of {math.ceil(limits.cpu_s)}s exceeded ({sig.name})"
        if sig == signal.SIGXFSZ:
            return "runtime_error", f"file size limit of {limits.file_size_mb} MiB exceeded (SIGXFSZ)"
        return "runtime_error", f"killed by signal {sig.name}"
    if last.startswith("MemoryError") or "Cannot allocate memory" in last:
        return "memory_limit", last
    if private_scratch and is_disk_full(last):
        return "disk_limit", f"disk budget of {limits.disk_mb} MiB exceeded ({last})"
    return "runtime_error", last or f"exit status {returncode}"


def is_disk_full(error: str) -> bool:
    """Whether an error line (a traceback's last line) is ENOSPC: with private scratch, the disk budget."""
    return "No space left on device" in error or "[Errno 28]" in error


def _child_setup(limits: SandboxLimits, uid: int | None, netns: bool, private: _Scratch | None) -> None:
    """Runs in the forked child, before exec: namespaces, scratch, rlimits, then the uid drop (order matters)."""
    flags = (_CLONE_NEWNET if netns else 0) | (_CLONE_NEWNS if private is not None else 0)
    if flags:
        _unshare(flags)
    if private is not None:
        _mount_scratch(private, uid)
    cpu = max(1, math.ceil(limits.cpu_s))
    mib = 1 << 20
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * mib, limits.memory_mb * mib))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_mb * mib, limits.file_size_mb * mib))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def _mount_scratch(s: _Scratch, uid: int | None) -> None:
    """In the child's new mount namespace: one tmpfs of `s.disk_mb` MiB over every world-writable dir,
    the read-only dirs bound back, the work dir made inside the private /tmp with its files; cd there."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing below propagates to the machine
    kept = [os.open(path, os.O_PATH | os.O_DIRECTORY) for path in s.read_only]  # before they are covered
    options = f"size={s.disk_mb}m,nr_inodes={_SCRATCH_INODES},mode=0700"
    _mount("tmpfs", s.workdir, "tmpfs", _MS_NOSUID | _MS_NODEV, options)
    for i in range(len(s.dirs)):
        os.mkdir(f"{s.workdir}/{i}")
        os.chmod(f"{s.workdir}/{i}", 0o1777)
    root = os.open(s.workdir, os.O_PATH | os.O_DIRECTORY)  # reachable after /tmp (and the path) is covered
    for i, directory in enumerate(s.dirs):
        _mount(f"/proc/self/fd/{root}/{i}", directory, None, _MS_BIND)
    os.close(root)
    for path, fd in zip(s.read_only, kept):
        os.makedirs(path, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC)
        _mount(None, path, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
        os.close(fd)
    os.mkdir(s.workdir, 0o700)
    _write_files(s.workdir, s.payload, uid)
    os.chdir(s.workdir)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    args = [None if x is None else os.fsencode(x) for x in (source, target, fstype)]
    if _LIBC.mount(*args, flags, None if data is None else os.fsencode(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _unshare(flags: int) -> None:
    if _LIBC.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare({flags:#x}): {os.strerror(err)}")


@functools.cache
def _netns_available() -> bool:
    """Whether this kernel and these privileges allow a network namespace (probed once, in a child)."""
    return _probe(functools.partial(_unshare, _CLONE_NEWNET))


@functools.cache
def _scratch_available() -> bool:
    """Whether private scratch space can be set up here (probed once, in a child, the way a run does it)."""
    dirs = _scratch_dirs()
    if not dirs or dirs[0] != os.path.realpath("/tmp"):
        return False
    workdir = _new_workdir("private")
    try:
        # the probe runs sys.executable: keep its prefix (a venv under /tmp) and its target's visible
        prefixes = tuple(
            os.path.dirname(os.path.dirname(p)) for p in (sys.executable, os.path.realpath(sys.executable))
        )
        private = _Scratch(workdir, {}, 1, dirs, _under_scratch(prefixes))
        return _probe(lambda: (_unshare(_CLONE_NEWNS), _mount_scratch(private, None)))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _probe(preexec_fn: Callable[[], object]) -> bool:
    """Whether the trainer's Python starts after `preexec_fn` ran in the child."""
    try:
        subprocess.run(
            [sys.executable, "-I", "-S", "-c", ""],
            preexec_fn=preexec_fn,
            check=True,
            env={},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return True


@functools.cache
def _scratch_dirs() -> tuple[str, ...]:
    """The machine's world-writable directories that exist (real paths, /tmp first)."""
    dirs: list[str] = []
    for d in _WORLD_WRITABLE:
        real = os.path.realpath(d)
        if os.path.isdir(real) and real not in dirs:
            dirs.append(real)
    return tuple(dirs)


def _under_scratch(paths: tuple[str, ...]) -> tuple[str, ...]:
    """The existing directories among `paths` (real paths) that lie under a world-writable directory."""
    found: list[str] = []
    for path in paths:
        real = os.path.realpath(path)
        if (
            os.path.isdir(real)
            and real not in found
            and any(real.startswith(d + os.sep) for d in _scratch_dirs())
        ):
            found.append(real)
    return tuple(found)


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
    """Whether any uid can exec `path` and read its standard library (every parent dir o+x)."""
    prefix = os.path.dirname(os.path.dirname(path))
    lib = os.path.join(prefix, "lib")
    for p in (path, lib):
        parts = p.split(os.sep)
        for i in range(2, len(parts) + 1):
            mode = os.stat(os.sep.join(parts[:i]) or os.sep).st_mode
            if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
                return False
    return bool(os.stat(path).st_mode & stat.S_IXOTH)


def _payload(workdir: str, files: dict[str, bytes], network: str) -> dict[str, bytes]:
    """The files of a run (`main.py` and the socket prelude included); ValueError for a name outside `workdir`."""
    payload = dict(files)
    if network == "blocked":
        payload[_PRELUDE_NAME] = _SOCKET_PRELUDE.format(script="main.py").encode()
    for name in payload:
        path = os.path.realpath(os.path.join(workdir, name))
        if not path.startswith(os.path.realpath(workdir) + os.sep):
            raise ValueError(f"sandbox file {name!r} is outside the work directory")
    return payload


def _write_files(workdir: str, payload: dict[str, bytes], uid: int | None) -> None:
    """Write `payload` into `workdir` and hand it all to `uid` (also called in the child: plain os calls)."""
    for name, data in payload.items():
        path = os.path.join(workdir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    if uid is not None:
        for root, dirs, names in os.walk(workdir):
            for name in dirs + names:
                os.chown(os.path.join(root, name), uid, uid)
        os.chown(workdir, uid, uid)


_uids_in_use: dict[int, int] = {}
"""uid -> the descriptor of its lock file, held while a run of this process uses the uid."""
_uid_lock = threading.Lock()
_UID_LOCK_DIR = os.path.join(
    "/run" if os.access("/run", os.W_OK) else tempfile.gettempdir(), "rlstack-sandbox-uids"
)
if os.geteuid() == 0:  # made once, at import, not in the middle of a caller's run
    with contextlib.suppress(OSError):
        os.makedirs(_UID_LOCK_DIR, mode=0o700, exist_ok=True)


def _allocate_uid() -> int:
    """A uid no process has now and no other run holds, in this process or any other.

    Runs are started by several processes (launchers, reward actors, other trainers), so a uid is
    reserved with an exclusive `flock` on `/run/rlstack-sandbox-uids/<uid>` (root-only directory):
    the kernel drops the lock when its holder exits, so a crash never leaks a reservation.
    """
    with _uid_lock:
        os.makedirs(_UID_LOCK_DIR, mode=0o700, exist_ok=True)
        while True:
            uid = _UID_BASE + random.randrange(_UID_RANGE)
            if uid in _uids_in_use:
                continue
            fd = os.open(os.path.join(_UID_LOCK_DIR, str(uid)), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            if processes_of_uid(uid):
                os.close(fd)
                continue
            _uids_in_use[uid] = fd
            return uid


def _release_uid(uid: int) -> None:
    with _uid_lock:
        fd = _uids_in_use.pop(uid, None)
    if fd is not None:
        os.close(fd)


def processes_of_uid(uid: int) -> list[int]:
    """Live (not zombie) processes whose real uid is `uid`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = f.read()
            state = status[status.index("\nState:") + 7 :].lstrip()[:1]
            real_uid = int(status[status.index("\nUid:") + 5 :].split(None, 1)[0])
        except (OSError, ValueError):
            continue
        if real_uid == uid and state not in ("Z", "X"):
            pids.append(int(entry))
    return pids


def _processes_in_group(pgid: int) -> list[int]:
    """Live processes whose process group is `pgid` (the handle on a run when there is no uid of its own)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            pids.append(int(entry))
    return pids


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` and wait until none is left.

    The fast way is `kill(-1, SIGKILL)` from a helper running as `uid` (`setpriv` drops to the uid,
    which clears every capability, then execs `kill -s KILL -- -1`): Linux signals every process of
    the uid in one pass under the task-list lock, and a process with SIGKILL pending cannot fork, so
    no child escapes it; what is left is waiting for the dying to leave /proc. The helper is started
    with vfork (no `preexec_fn`, no `user=`), so it costs the same from a trainer holding gigabytes
    as from a small process. Without `setpriv` and `kill`: scan and kill until two scans in a row
    find none (`_kill_all`).
    """
    if _KILL_HELPER is not None and uid >= _UID_BASE:
        setpriv, kill = _KILL_HELPER
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [
                    setpriv,
                    f"--reuid={uid}",
                    f"--regid={uid}",
                    "--clear-groups",
                    kill,
                    "-s",
                    "KILL",
                    "--",
                    "-1",
                ],
                env={},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=10,
            )
            for _ in range(2000):
                pids = processes_of_uid(uid)
                if not pids:
                    return
                for pid in pids:  # not expected (the helper signalled them all); harmless
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.001)
    _kill_all(lambda: processes_of_uid(uid))


def _kill_helper() -> tuple[str, str] | None:
    found = [shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin") for name in ("setpriv", "kill")]
    return None if None in found else (found[0], found[1])


_KILL_HELPER = _kill_helper()
"""`setpriv` and `kill` (util-linux, procps), with which `_kill_uid` signals as the sandbox uid."""


def _kill_all(find: Callable[[], list[int]]) -> None:
    """SIGKILL the processes `find` lists until two scans in a row list none (they may still be forking).

    One empty scan is not enough: a process that forks and exits between the scan's listing of /proc
    and the reading of its status (a double-forked daemon) leaves a child the listing missed; the
    next scan lists it.
    """
    empty_scans = 0
    for _ in range(200):
        pids = find()
        empty_scans = 0 if pids else empty_scans + 1
        if empty_scans == 2:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


def _remove_uid_files(uid: int) -> None:
    for d in _WORLD_WRITABLE:
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                pass


def _failed(why: str, network: str, scratch: str, start: float) -> SandboxResult:
    return SandboxResult("sandbox_error", None, "", "", why, time.monotonic() - start, network, None, scratch)
