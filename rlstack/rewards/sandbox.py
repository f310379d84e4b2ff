"""Running untrusted Python (model-written code, later the agent's Python tool) without harming the trainer.

Every run is a fresh `python -I -S -B main.py` subprocess, never the calling process, in its own
session and process group, in a fresh temporary directory that is removed afterwards, with a scrubbed
environment (PATH, LANG, PYTHONHASHSEED, HOME=the work dir: nothing of the parent's, so no secrets).

Isolation, in the order `preexec_fn` applies it in the child before `exec`:

- **Network.** `unshare(CLONE_NEWNET)` (via libc; `os.unshare` is 3.12+) puts the child in an empty
  network namespace: no interfaces but a loopback that is down, so even 127.0.0.1 is unreachable.
  Where the kernel refuses (not root, no CAP_SYS_ADMIN), a prelude replaces `socket.socket` with one
  that raises; that only stops ordinary Python code (ctypes can still make syscalls), and the result
  says which of the two was used (`network`: `namespace` or `blocked`).
- **Limits.** `setrlimit` of CPU time (SIGXCPU at `cpu_s`, SIGKILL a second later), address space,
  file size (SIGXFSZ), process count, and no core files.
- **Unprivileged uid.** When the trainer runs as root, the child drops to a uid of its own
  (`_UID_BASE` + random, no passwd entry needed; supplementary groups cleared). This is what makes
  the process limit work (RLIMIT_NPROC counts the processes of the real uid and is ignored for
  root), takes away every capability (a sandboxed program cannot signal the trainer, read its
  `/proc/<pid>/environ`, or write to root-owned places), and marks every process of the run, so
  that after the run all processes of that uid are killed, including a double-forked daemon that
  left the process group with `setsid`. Files it left in the world-writable `/tmp`, `/var/tmp` and
  `/dev/shm` are removed too. Not root: no uid switch, the process group is the only handle.
  (cgroup v1 is mounted read-only-in-practice in containers; we do not use cgroups.)

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
system calls: libc is loaded once, in the parent, at import.
"""

from __future__ import annotations

import contextlib
import ctypes
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

_CLONE_NEWNET = 0x40000000
_UID_BASE = 200_000
_UID_RANGE = 60_000
_SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
_WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm")
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


DEFAULT_LIMITS = SandboxLimits()


@dataclass
class SandboxResult:
    status: str
    """`ok`, `runtime_error`, `time_limit`, `memory_limit`, `output_limit` or `sandbox_error`."""
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


def run_python(
    code: str,
    stdin: str = "",
    limits: SandboxLimits = DEFAULT_LIMITS,
    files: dict[str, bytes] | None = None,
) -> SandboxResult:
    """Run `code` as `main.py` in a fresh sandbox (see module docstring) and return what happened."""
    start = time.monotonic()
    network = "namespace" if _netns_available() else "blocked"
    python = _interpreter()
    if python is None:
        return _failed("no Python interpreter the sandbox uid can execute", network, start)
    uid = _allocate_uid() if os.geteuid() == 0 else None
    workdir = tempfile.mkdtemp(prefix="rlstack-sandbox-")
    try:
        _write_files(workdir, {**(files or {}), "main.py": code.encode()}, "main.py", network, uid)
        with tempfile.TemporaryFile() as stdin_file:
            stdin_file.write(stdin.encode())
            stdin_file.seek(0)
            return _run(python, workdir, stdin_file, limits, uid, network, start)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return _failed(f"{type(e).__name__}: {e}", network, start)
    finally:
        _release_run(uid, workdir)


def _release_run(uid: int | None, workdir: str) -> None:
    """After a run: kill what is left of the uid, remove its files and the work dir, free the uid."""
    if uid is not None:
        _kill_uid(uid)
        _remove_uid_files(uid)
        _release_uid(uid)
    shutil.rmtree(workdir, ignore_errors=True)


def _run(python, workdir, stdin_file, limits, uid, network, start) -> SandboxResult:
    proc = _spawn(python, "main.py", workdir, stdin_file, limits, uid, network)
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
    status, error_line = _classify(proc.returncode, err, killed_for, limits)
    return SandboxResult(status, proc.returncode, out, err, error_line, wall_s, network, uid)


def _spawn(python, script, workdir, stdin, limits, uid, network) -> subprocess.Popen:
    """Start `script` (already in `workdir`) under the sandbox; stdout and stderr are pipes."""
    env = {
        "PATH": _SANDBOX_PATH,
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONIOENCODING": "utf-8",
        "HOME": workdir,
        "TMPDIR": workdir,
    }
    return subprocess.Popen(
        [python, "-I", "-S", "-B", script if network == "namespace" else _PRELUDE_NAME],
        cwd=workdir,
        env=env,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
        preexec_fn=functools.partial(_child_setup, limits, uid, network == "namespace"),
    )


class SandboxProcess:
    """A long-lived program in the sandbox that talks to its parent over pipes (see module docstring).

    `stdin` / `stdout` are the parent's ends of the program's stdin and stdout (a protocol of the
    caller's choosing), `stderr` the read end of its console. Raises `OSError` (or `ValueError` for a
    file name outside the work dir) when it cannot start; everything is cleaned up by then.
    `close()` kills every process of the run and removes its files; it also runs when the object is
    garbage-collected or the trainer exits, so a forgotten close leaves nothing behind for long.
    """

    def __init__(self, script: str, files: dict[str, bytes], limits: SandboxLimits) -> None:
        self.network = "namespace" if _netns_available() else "blocked"
        python = _interpreter()
        if python is None:
            raise OSError("no Python interpreter the sandbox uid can execute")
        self.uid = _allocate_uid() if os.geteuid() == 0 else None
        self.workdir = tempfile.mkdtemp(prefix="rlstack-sandbox-")
        try:
            _write_files(
                self.workdir, {**files, "main.py": script.encode()}, "main.py", self.network, self.uid
            )
            proc = _spawn(python, "main.py", self.workdir, subprocess.PIPE, limits, self.uid, self.network)
        except (OSError, subprocess.SubprocessError) as e:
            _release_run(self.uid, self.workdir)
            raise OSError(f"starting the sandboxed process failed: {type(e).__name__}: {e}") from e
        self._proc = proc
        self.pid = proc.pid
        self.stdin, self.stdout, self.stderr = proc.stdin, proc.stdout, proc.stderr
        self._finalizer = weakref.finalize(self, _end_process, proc, self.uid, self.workdir)

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


def _end_process(proc: subprocess.Popen, uid: int | None, workdir: str) -> None:
    _kill_group(proc.pid)
    if uid is not None:
        _kill_uid(uid)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        with contextlib.suppress(OSError):
            pipe.close()
    proc.wait()
    _release_run(uid, workdir)


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


def _classify(returncode: int, stderr: str, killed_for: str | None, limits: SandboxLimits) -> tuple[str, str]:
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
    return "runtime_error", last or f"exit status {returncode}"


def _child_setup(limits: SandboxLimits, uid: int | None, netns: bool) -> None:
    """Runs in the forked child, before exec: namespace, rlimits, then the uid drop (order matters)."""
    if netns:
        _unshare_net()
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


def _unshare_net() -> None:
    if _LIBC.unshare(_CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}")


@functools.cache
def _netns_available() -> bool:
    """Whether this kernel and these privileges allow a network namespace (probed once, in a child)."""
    try:
        subprocess.run(
            [sys.executable, "-I", "-S", "-c", ""],
            preexec_fn=_unshare_net,
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


def _write_files(workdir: str, files: dict[str, bytes], script: str, network: str, uid: int | None) -> None:
    payload = dict(files)
    if network == "blocked":
        payload[_PRELUDE_NAME] = _SOCKET_PRELUDE.format(script=script).encode()
    for name, data in payload.items():
        path = os.path.realpath(os.path.join(workdir, name))
        if not path.startswith(os.path.realpath(workdir) + os.sep):
            raise ValueError(f"sandbox file {name!r} is outside the work directory")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    if uid is not None:
        for root, dirs, names in os.walk(workdir):
            for name in dirs + names:
                os.chown(os.path.join(root, name), uid, uid)
        os.chown(workdir, uid, uid)


_uids_in_use: set[int] = set()
_uid_lock = threading.Lock()


def _allocate_uid() -> int:
    """A uid no process has now and no other run of this trainer holds."""
    with _uid_lock:
        while True:
            uid = _UID_BASE + random.randrange(_UID_RANGE)
            if uid not in _uids_in_use and not processes_of_uid(uid):
                _uids_in_use.add(uid)
                return uid


def _release_uid(uid: int) -> None:
    with _uid_lock:
        _uids_in_use.discard(uid)


def processes_of_uid(uid: int) -> list[int]:
    """Live (not zombie) processes whose real uid is `uid`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith(("Z", "X")):
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
    """SIGKILL every process of `uid` until none is left (a fork bomb is bounded by RLIMIT_NPROC)."""
    _kill_all(lambda: processes_of_uid(uid))


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


def _failed(why: str, network: str, start: float) -> SandboxResult:
    return SandboxResult("sandbox_error", None, "", "", why, time.monotonic() - start, network, None)
