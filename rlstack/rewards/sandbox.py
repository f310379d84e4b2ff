"""Running untrusted Python (model-written code, the agent's Python tool) without harming the trainer.

Every program is a fresh `python -I -S -B main.py` process, never the calling process, started by a
small launcher process rather than by the caller (`run_python`, `SandboxProcess`; see
`rlstack/rewards/launcher.py`: forking a trainer that holds a model is slow, and a CUDA context
must not be forked), with a scrubbed environment (PATH, LANG, PYTHONHASHSEED, HOME=TMPDIR=the work
dir: nothing of the parent's, so no secrets).

What the program sees (set up by `_child_setup` in the forked child before `exec`):

- **Its own root.** A new mount namespace whose `/` is a tmpfs of `disk_mb` MiB (at most 16384
  files) holding only: the system's program and library directories (`/usr`, and `/bin`, `/lib`,
  ... as on the machine), the dynamic loader's cache, the time zone and `/etc/fonts`, the
  interpreter's own prefix when it lies elsewhere (e.g. pyenv's, under an otherwise invisible
  `/root`), and the caller's `read_only` directories (the Python tool's packages), all bound
  read-only at their own paths; `/dev/null`, `zero`, `full`, `random`, `urandom`; world-writable
  `/tmp`, `/var/tmp`, `/dev/shm` and `/run/lock`; the work dir (its files written there first).
  The machine's tree is detached (`pivot_root`): the dataset, checkpoints, the project, `/home`,
  `/root` and the machine's `/tmp` and `/dev/shm` do not exist for it. Everything it writes is on
  that tmpfs, so one budget covers it all: writing past it fails with ENOSPC (status `disk_limit`).
  Nothing it writes is seen by the machine or another run, and it all goes away with the run.
- **Its own processes.** A new PID namespace with its own `/proc`: the program is process 2, under
  an init (process 1) that reaps orphans and, when the program ends, exits, which kills everything
  left in the namespace. It cannot see or signal any process of the machine.
- **No IPC with anything.** A new IPC namespace in which System V shared memory and message queues
  and POSIX message queues are off (their limits are 0): `shmget` / `msgget` fail with ENOSPC.
  POSIX shared memory is files in its `/dev/shm`, inside `disk_mb`.
- **No network.** A new, empty network namespace: no interface but a loopback that is down, so even
  127.0.0.1 is unreachable. A new UTS namespace hides the host name.
- **Limits.** `setrlimit` of CPU time (SIGXCPU at `cpu_s`, SIGKILL a second later), address space,
  file size (SIGXFSZ), process count, POSIX message-queue bytes (0), and no core files.
- **No namespaces of its own.** A seccomp filter refuses `unshare`, `setns` and a `clone` that
  asks for a new namespace (threads and forks are fine): without it, a program could become root
  of a new user namespace and mount a tmpfs, or make shared memory, past its budget.
- **An unprivileged uid of its own** (as root: `_UID_BASE` + random, no passwd entry; supplementary
  groups cleared): no capabilities, the process limit applies (RLIMIT_NPROC counts the real uid's
  processes), and every process of the run is marked, so that after the run all processes of that
  uid are killed too. **Not root:** a new user namespace too, in which the caller's uid and gid are
  0 (that is what lets the run set its IPC limits); the program runs there with no capability at
  all (securebits NOROOT, locked; an empty bounding set; no ambient set), so it is an ordinary
  process that owns the files of its own root, and its process limit counts in its namespace.

Three processes do this (`_child_setup`): P, the forked child, makes the namespaces and builds the
root, forks X (process 1 of the new PID namespace: it enters the root, mounts `/proc`, turns IPC
off) and waits; X forks Y, which sets the limits, drops to the uid and execs the program. P ends
as the program did (its exit status, or its signal), so callers see the program's own status; it
first says on a pipe that it has reaped X, whose end ended every process of the namespace, so a
run that ended by itself needs no search for leftovers. P dies with its launcher and X with P
(`PR_SET_PDEATHSIG`), so a launcher that dies leaves nothing running.

There is no weaker fallback: where these namespaces cannot be made (not root and no unprivileged
user namespaces; a container without CAP_SYS_ADMIN or whose seccomp profile forbids
`unshare`/`mount`), `isolation_problem()` (a probe run, in a launcher) says so with the fix, config validation refuses `builtin:code` with `sandbox=local` and `builtin:python`
at load, and a run that gets here anyway returns `sandbox_error`.

The interpreter must be one the sandbox uid can run: `sys.executable` when every directory from
its prefix down is world-searchable, else the first `python3` on the sandbox PATH.

The wall-clock limit kills the whole process group (SIGKILL, so ignoring SIGTERM does not help),
then every process of the uid. stdout/stderr are read incrementally and the run is killed once
either passes `max_output_bytes`.

`SandboxProcess` is the long-lived form (the agent's Python interpreter tool): the same isolation and
clean-up, but the program keeps running between exchanges and talks to its caller over its stdin
and stdout pipes (passed to the caller by the launcher); stderr is its console. Its CPU limit is a
budget for its whole life; wall-clock and output limits are per exchange, so they are the caller's
to enforce.

`preexec_fn` runs in the forked child of a launcher (a small single-threaded process), so it only
makes plain system calls (`os.*`, libc's `unshare`, `mount`, `pivot_root` via ctypes; libc is loaded
once, at import) and imports nothing: paths and file contents are prepared in the parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
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
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from rlstack.rewards import launcher

_CLONE_NEWUSER = 0x10000000
_INNER_ID = 0
"""The uid and gid the caller's are mapped to in a run's user namespace (when the caller is not root):
0, which the namespace's System V IPC limits need to be set; the program then runs without any
capability (`_drop_capabilities`)."""
_CLONE_NEWNET, _CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWPID, _CLONE_NEWUTS = (
    0x40000000,
    0x00020000,
    0x08000000,
    0x20000000,
    0x04000000,
)
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 0x1, 0x2, 0x4, 0x8, 0x20
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 0x40000
_MNT_DETACH = 0x2


class _Machine(NamedTuple):
    """System call numbers and the seccomp architecture of a machine the sandbox supports."""

    audit_arch: int
    pivot_root: int
    clone: int
    clone3: int
    unshare: int
    setns: int
    mount_setattr: int = 442


_MACHINES = {
    "x86_64": _Machine(0xC000003E, pivot_root=155, clone=56, clone3=435, unshare=272, setns=308),
    "aarch64": _Machine(0xC00000B7, pivot_root=41, clone=220, clone3=435, unshare=97, setns=268),
}
_MACHINE = _MACHINES.get(os.uname().machine)
_NEW_NAMESPACES = 0x10000000 | 0x00020000 | 0x20000000 | 0x40000000 | 0x08000000 | 0x04000000 | 0x02000000
"""CLONE_NEWUSER, NEWNS, NEWPID, NEWNET, NEWIPC, NEWUTS, NEWCGROUP: what `clone` may not ask for."""
_SCRATCH_INODES = 16384
_PAGE = 4096
_UID_BASE = 200_000
_UID_RANGE = 60_000
_SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
_SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
"""World-writable directories of the program's root (on its tmpfs, so inside `disk_mb`)."""
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/fonts")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_IPC_OFF = ("kernel/shmmni", "kernel/shmall", "kernel/msgmni", "fs/mqueue/queues_max")
"""Per-IPC-namespace limits set to 0 in the run's namespace: no System V shared memory or message
queues, no POSIX message queues (POSIX shared memory is files in /dev/shm, inside `disk_mb`)."""
_SETUP_FAILED = "rlstack sandbox: setting up the run failed: "
_SETUP_EXIT = 125
_DONE = b"\x01"
_READ_CHUNK = 1 << 16
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_LIBC.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


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
    """Processes and threads the program may have at once (RLIMIT_NPROC: counted for its own uid, or in
    its own user namespace when the caller is not root; see module)."""
    max_output_bytes: int = 1 << 20
    """Cap on each of stdout and stderr; past it the run is killed (status `output_limit`)."""
    disk_mb: int = 128
    """Total MiB (and at most 16384 files) of everything the program writes: its root is one tmpfs holding
    the work dir, /tmp, /var/tmp and /dev/shm; past it writes fail with ENOSPC (status `disk_limit`)."""


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


def run_python(
    code: str,
    stdin: str = "",
    limits: SandboxLimits = DEFAULT_LIMITS,
    files: dict[str, bytes] | None = None,
) -> SandboxResult:
    """Run `code` as `main.py` in a fresh sandbox (see module docstring) and return what happened.

    The run is started by a small launcher process (`rlstack.rewards.launcher`), never by the caller,
    so that a trainer holding a model is never forked. A launcher that dies is replaced once; when
    no launcher can run it, the result is `sandbox_error`.
    """
    start = time.monotonic()
    try:
        return launcher.pool().run((code, stdin, limits, files))
    except launcher.LauncherError:
        try:
            return launcher.pool().run((code, stdin, limits, files))
        except launcher.LauncherError as e:
            return _failed(f"no launcher could start the run: {e}", start)


def run_python_here(
    code: str,
    stdin: str = "",
    limits: SandboxLimits = DEFAULT_LIMITS,
    files: dict[str, bytes] | None = None,
) -> SandboxResult:
    """`run_python`, started from this process (a launcher's: see `run_python`)."""
    start = time.monotonic()
    problem = isolation_problem()
    if problem is not None:
        return _failed(problem, start)
    python = _interpreter()
    if python is None:
        return _failed("no Python interpreter the sandbox uid can execute", start)
    try:
        with tempfile.TemporaryFile() as stdin_file:
            stdin_file.write(stdin.encode())
            stdin_file.seek(0)
            proc, run = _start(python, code, files or {}, limits, (), stdin_file)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return _failed(f"{type(e).__name__}: {e}", start)
    try:
        return _run(proc, run, limits, start)
    finally:
        run.release(gone=True)


def _start(
    python: str,
    script: str,
    files: dict[str, bytes],
    limits: SandboxLimits,
    read_only: tuple[str, ...],
    stdin,
) -> tuple[subprocess.Popen, _Run]:
    """Start `script` as `main.py` (with `files`) in a new run: P and the run's handles. Raises
    `OSError`, `subprocess.SubprocessError` or `ValueError` (bad files) with the run released."""
    run = _Run.new()
    try:
        jail = _jail(run, {**files, "main.py": script.encode()}, limits, python, read_only)
        return _spawn(python, stdin, limits, jail, run), run
    except BaseException:
        run.release()
        raise


@dataclass
class _Run:
    """One run's handles: its uid, the mount point of its root, its PID namespace, and the read end
    of the pipe on which P says the run has ended."""

    uid: int | None
    """The run's own uid (root only); None: the program runs under the caller's uid, mapped into a
    user namespace of its own (`_INNER_ID`)."""
    root: str
    namespace: int | None = None
    """The inode of the run's PID namespace, which finds its processes (read from P right after it
    started; `namespace_fd` keeps the namespace, and so the inode, from being reused meanwhile)."""
    namespace_fd: int | None = None
    done: int | None = None

    @classmethod
    def new(cls) -> _Run:
        return cls(_allocate_uid() if os.geteuid() == 0 else None, _new_root())

    @property
    def program_uid(self) -> int:
        """The uid the program runs under, as it sees it."""
        return _INNER_ID if self.uid is None else self.uid

    def processes(self) -> list[int]:
        """The live processes of the run."""
        if self.namespace is not None:
            return processes_in_namespace(self.namespace)
        return processes_of_uid(self.uid) if self.uid is not None else []

    def kill(self) -> None:
        """SIGKILL every process of the run and wait until none is left: those of its PID namespace
        (none can leave it: seccomp refuses `setns`), else those of its uid."""
        if self.namespace is not None:
            _kill_all(lambda: processes_in_namespace(self.namespace))
        elif self.uid is not None:
            _kill_all(lambda: processes_of_uid(self.uid))

    def ended(self, proc: subprocess.Popen) -> bool:
        """Reap P; whether the run is known to be over: P said so on its pipe (it does once it has
        reaped X, the namespace's init, whose end ends every other process of the namespace)."""
        proc.wait()
        if self.done is None:
            return False
        try:
            return os.read(self.done, 1) == _DONE
        finally:
            os.close(self.done)
            self.done = None

    def release(self, gone: bool = False) -> None:
        """After the run: kill what is left of it (unless it is known to be `gone`), free its uid,
        remove the (empty) mount point of its root. Its files went away with its mount namespace."""
        if not gone:
            self.kill()
        for fd in (self.done, self.namespace_fd):
            if fd is not None:
                os.close(fd)
        self.done = self.namespace_fd = None
        if self.uid is not None:
            _release_uid(self.uid)
        shutil.rmtree(self.root, ignore_errors=True)


def processes_in_namespace(namespace: int) -> list[int]:
    """Live (not zombie) processes in the PID namespace whose inode is `namespace`."""
    return _live_processes(lambda pid, status: os.stat(f"/proc/{pid}/ns/pid").st_ino == namespace)


def processes_of_uid(uid: int) -> list[int]:
    """Live (not zombie) processes whose real uid is `uid`."""
    return _live_processes(lambda pid, status: int(_field(status, "Uid").split()[0]) == uid)


def _live_processes(keep: Callable[[str, str], bool]) -> list[int]:
    """The live (not zombie) processes for which `keep(pid, /proc/<pid>/status text)` holds."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = f.read()
            if _field(status, "State")[:1] not in ("Z", "X") and keep(entry, status):
                pids.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return pids


def _field(status: str, name: str) -> str:
    """A field of a /proc/<pid>/status text (ValueError when it has none)."""
    at = status.index(f"\n{name}:") + len(name) + 2
    return status[at : status.index("\n", at)].strip()


def _pid_in_namespace(pid: int) -> int | None:
    """The pid of `pid` in its own (innermost) PID namespace: 1 is a run's init, 2 its program."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(_field(f.read(), "NSpid").split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _run(proc: subprocess.Popen, run: _Run, limits: SandboxLimits, start: float) -> SandboxResult:
    """Watch a started run to its end (then every process of it is gone) and return its result."""
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    killed_for = _watch(proc.pid, bufs, limits, start)
    # Kill before reaping: the unreaped child keeps its process group id from being reused.
    _kill_group(proc.pid)
    if not run.ended(proc):
        run.kill()
    stdout, stderr = _drain(bufs, limits.max_output_bytes)
    proc.stdout.close()
    proc.stderr.close()
    wall_s = time.monotonic() - start
    out = stdout.decode(errors="replace")
    err = stderr.decode(errors="replace")
    status, error_line = _classify(proc.returncode, err, killed_for, limits)
    return SandboxResult(
        status, proc.returncode, out, err, error_line, wall_s, "namespace", run.uid, "private"
    )


@dataclass(frozen=True)
class _Jail:
    """What the child needs to build the program's file system (`_build_root`, `_enter_root`),
    prepared in the parent."""

    root: str
    """An empty root-only directory under the machine's /tmp: the mount point of the run's tmpfs,
    which becomes the program's `/`. The program's working directory is this same path inside its
    root (under its own /tmp)."""
    payload: dict[str, bytes]
    """Files to write into the work dir (names already checked to stay inside it)."""
    disk_mb: int
    """Size of the tmpfs: the budget for everything the program writes (work dir, /tmp, /dev/shm, ...)."""
    read_only: tuple[str, ...]
    """Directories and files of the machine bound in at the same paths, read-only: the system's
    programs and libraries, the interpreter's prefix, the caller's `read_only` (e.g. packages)."""
    links: tuple[tuple[str, str], ...]
    """Symbolic links to make, (path, target): `/bin -> usr/bin` on a merged-/usr system, `/dev/fd`."""
    uid: int
    """The uid the program runs under (in its user namespace, where it has one)."""
    user_namespace: bool
    """Whether the run gets a user namespace of its own (the caller is not root): the caller's uid and
    gid are mapped to `uid` there."""
    launcher: int
    """The pid of the process starting the run (P dies with it)."""


def _new_root() -> str:
    """A fresh, root-only mount point for a run's root directory."""
    return tempfile.mkdtemp(prefix="rlstack-sandbox-", dir="/tmp")


def _jail(
    run: _Run,
    files: dict[str, bytes],
    limits: SandboxLimits,
    python: str,
    read_only: tuple[str, ...],
) -> _Jail:
    """Check the run's files and describe its file system.

    Raises ValueError for a file outside the work dir or files larger than the disk budget.
    """
    root = run.root
    payload = _payload(root, files)
    size = sum(-(-len(data) // _PAGE) * _PAGE for data in payload.values())
    if size > limits.disk_mb << 20:
        raise ValueError(
            f"the sandbox's files ({size / (1 << 20):.1f} MiB) do not fit its disk budget of "
            f"{limits.disk_mb} MiB (SandboxLimits.disk_mb)"
        )
    system, links = _system_paths()
    shown = [*system]
    for path in (*_prefixes(python), *read_only):
        real = os.path.realpath(path)
        if os.path.exists(real) and not any(real == p or real.startswith(p + os.sep) for p in shown):
            shown.append(real)
    return _Jail(
        root, payload, limits.disk_mb, tuple(shown), links, run.program_uid, run.uid is None, os.getpid()
    )


@functools.cache
def _system_paths() -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(what of the machine every sandbox sees read-only, the links to make): the system's program and
    library directories (a link such as `/lib -> usr/lib` is made as a link), the dynamic loader's
    cache, the time zone, and the harmless devices."""
    shown: list[str] = []
    links: list[tuple[str, str]] = [("/dev/fd", "/proc/self/fd")]
    links += [(f"/dev/{name}", f"/proc/self/fd/{i}") for i, name in enumerate(("stdin", "stdout", "stderr"))]
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            links.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            shown.append(path)
    for path in _SYSTEM_FILES + _DEVICES:
        if os.path.islink(path):  # /etc/localtime -> /usr/share/zoneinfo/...: the target is shown already
            links.append((path, os.readlink(path)))
        elif os.path.exists(path):
            shown.append(path)
    return tuple(shown), tuple(links)


def _spawn(python: str, stdin, limits: SandboxLimits, jail: _Jail, run: _Run) -> subprocess.Popen:
    """Start `main.py` in `jail` (see `_child_setup`) and return P; stdout and stderr are pipes. Keeps
    in `run` the read end of the pipe on which P says that the whole run has ended (`_Run.ended`)
    and its PID namespace (None if P has ended already)."""
    env = {
        "PATH": _SANDBOX_PATH,
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONIOENCODING": "utf-8",
        "HOME": jail.root,
        "TMPDIR": jail.root,
    }
    done_read, done_write = os.pipe()
    try:
        proc = subprocess.Popen(
            [python, "-I", "-S", "-B", "main.py"],
            env=env,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
            pass_fds=(done_write,),
            preexec_fn=functools.partial(_child_setup, limits, jail, done_write),
        )
    except BaseException:
        os.close(done_read)
        raise
    finally:
        os.close(done_write)
    run.done = done_read
    try:  # held open until the run is released, so that its inode is not reused by another namespace
        run.namespace_fd = os.open(f"/proc/{proc.pid}/ns/pid_for_children", os.O_RDONLY | os.O_CLOEXEC)
        run.namespace = os.fstat(run.namespace_fd).st_ino
    except OSError:  # P has ended already: so has the run (see `_Run.ended`)
        pass
    return proc


class SandboxProcess:
    """A long-lived program in the sandbox that talks to its caller over pipes (the Python tool).

    Started by a launcher of its own (`rlstack.rewards.launcher`), never by the caller: the launcher
    starts a `LocalProcess` and passes back the program's pipes. `stdin` / `stdout` are the caller's
    ends of the program's stdin and stdout (a protocol of the caller's choosing), `stderr` the read
    end of its console. `read_only`: directories of the machine the program reads from (e.g.
    packages it imports), bound into its root at their own paths, read-only. Raises `OSError` (or
    `ValueError` for a file name outside the work dir, or files past `disk_mb`) when it cannot
    start; everything is cleaned up by then. `close()` kills every process of the run and removes
    its files; it also runs when the object is garbage-collected or the trainer exits (the
    launcher kills what it holds when its caller goes away), so a forgotten close leaves nothing
    behind for long.
    """

    network = "namespace"
    scratch = "private"

    def __init__(
        self, script: str, files: dict[str, bytes], limits: SandboxLimits, read_only: tuple[str, ...] = ()
    ) -> None:
        pool = launcher.pool()
        try:
            helper = pool.acquire()
        except launcher.LauncherError as e:
            raise OSError(f"no launcher could start the sandboxed process: {e}") from e
        try:
            reply, fds = helper.call(("start", (script, files, limits, tuple(read_only))))
        except (OSError, EOFError) as e:
            pool.discard(helper)
            raise OSError(
                f"the launcher starting the sandboxed process failed: {type(e).__name__}: {e}"
            ) from e
        if reply[0] == "error":
            pool.release(helper)
            raise (ValueError if reply[1] == "ValueError" else OSError)(reply[2])
        _, self.pid, self.uid, self.workdir = reply
        self.stdin = os.fdopen(fds[0], "wb", buffering=0)
        self.stdout = os.fdopen(fds[1], "rb", buffering=0)
        self.stderr = os.fdopen(fds[2], "rb", buffering=0)
        self._helper = helper
        self._returncode: int | None = None
        self._finalizer = weakref.finalize(
            self, _close_remote, pool, helper, (self.stdin, self.stdout, self.stderr)
        )

    def poll(self) -> int | None:
        """The exit status once the program has exited (negative: killed by that signal), else None."""
        if self._returncode is None and self._finalizer.alive:
            self._returncode = self._ask("poll")
        return self._returncode

    def kill_strays(self) -> None:
        """Kill every process of the run except the program itself (children it left running)."""
        if self._finalizer.alive:
            self._ask("kill_strays")

    def close(self) -> int | None:
        """Kill the program and everything of its run, remove its files; its exit status (idempotent)."""
        if self._finalizer.alive:
            returncode = self._finalizer()
            if self._returncode is None:
                self._returncode = returncode
        return self._returncode

    def _ask(self, what: str) -> Any:
        try:
            return self._helper.call((what,))[0]
        except (OSError, EOFError) as e:
            raise OSError(f"the sandboxed process's launcher is gone ({type(e).__name__}: {e})") from e


def _close_remote(pool: launcher.LauncherPool, helper: launcher.Launcher, pipes: tuple) -> int | None:
    """Close our ends of the pipes, have the launcher end the run, and give the launcher back."""
    for pipe in pipes:
        with contextlib.suppress(OSError):
            pipe.close()
    try:
        returncode = helper.call(("close",))[0]
    except (OSError, EOFError):
        pool.discard(helper)
        return None
    pool.release(helper)
    return returncode


class LocalProcess:
    """`SandboxProcess` as its launcher runs it: the program started from this process."""

    network = "namespace"
    scratch = "private"

    def __init__(
        self, script: str, files: dict[str, bytes], limits: SandboxLimits, read_only: tuple[str, ...] = ()
    ) -> None:
        problem = isolation_problem()
        if problem is not None:
            raise OSError(problem)
        python = _interpreter()
        if python is None:
            raise OSError("no Python interpreter the sandbox uid can execute")
        try:
            proc, run = _start(python, script, files, limits, read_only, subprocess.PIPE)
        except (OSError, subprocess.SubprocessError) as e:
            raise OSError(f"starting the sandboxed process failed: {type(e).__name__}: {e}") from e
        self._run = run
        self.uid, self.workdir = run.uid, run.root
        self._proc = proc
        self.pid = proc.pid
        self.stdin, self.stdout, self.stderr = proc.stdin, proc.stdout, proc.stderr
        self._finalizer = weakref.finalize(self, _end_process, proc, run)

    def poll(self) -> int | None:
        """The exit status once the program has exited (negative: killed by that signal), else None."""
        return self._proc.poll()

    def kill_strays(self) -> None:
        """Kill every process of the run except the program itself (children it left running)."""
        _kill_all(lambda: [p for p in self._run.processes() if _pid_in_namespace(p) not in (1, 2)])

    def close(self) -> int | None:
        """Kill the program and everything of its run, remove its files; its exit status (idempotent)."""
        self._finalizer()
        return self._proc.returncode


def _end_process(proc: subprocess.Popen, run: _Run) -> None:
    _kill_group(proc.pid)
    gone = run.ended(proc)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        with contextlib.suppress(OSError):
            if pipe is not None:
                pipe.close()
    run.release(gone)


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
    """(status, error line) of a finished run; ENOSPC means the run's own disk budget."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    if returncode == _SETUP_EXIT and stderr.startswith(_SETUP_FAILED):
        return "sandbox_error", stderr.strip()
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
    if is_disk_full(last):
        return "disk_limit", f"disk budget of {limits.disk_mb} MiB exceeded ({last})"
    return "runtime_error", last or f"exit status {returncode}"


def is_disk_full(error: str) -> bool:
    """Whether an error line (a traceback's last line) is ENOSPC: the run's disk budget."""
    return "No space left on device" in error or "[Errno 28]" in error


def _child_setup(limits: SandboxLimits, jail: _Jail, done: int) -> None:
    """Runs in the forked child (P) before exec; see the module docstring for the three processes.

    P: new namespaces (mount, network, IPC, PID, host name) and the run's root built on its tmpfs,
    then P forks X, the first process of the new PID namespace, and only waits. X moves into the
    root (`pivot_root`, the machine's tree detached), mounts the namespace's own /proc, turns System
    V IPC off, and forks Y. X waits too: when Y ends, X passes Y's wait status to P and exits, which
    kills whatever else is left in the namespace. Y sets the limits, drops to the run's uid and
    returns here, so `subprocess` closes the other descriptors and execs the program as Y. P ends
    the way Y ended (the same exit status, or the same signal), after saying on `done` that X (and
    so every process of the run) is gone.
    """
    _die_with_parent(jail.launcher)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.umask(0o022)
    outer_uid, outer_gid = os.geteuid(), os.getegid()
    flags = _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWPID | _CLONE_NEWUTS
    _unshare(flags | (_CLONE_NEWUSER if jail.user_namespace else 0))
    if jail.user_namespace:
        _map_ids(jail.uid, outer_uid, outer_gid)
    _build_root(jail)
    status_read, status_write = os.pipe()
    if os.fork():
        _close_all_but(status_read, done)
        _follow(status_read, done)
    os.close(status_read)
    _die_with_parent(None)
    os.close(done)
    try:
        _enter_root(jail.root)
    except BaseException as e:  # noqa: BLE001 - X must never return into subprocess's code
        with contextlib.suppress(OSError):
            os.write(2, f"{_SETUP_FAILED}{type(e).__name__}: {e}\n".encode())
        os._exit(_SETUP_EXIT)
    program = os.fork()
    if program:
        _close_all_but(status_write)
        _init(program, status_write)
    os.close(status_write)
    cpu = max(1, math.ceil(limits.cpu_s))
    mib = 1 << 20
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * mib, limits.memory_mb * mib))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_mb * mib, limits.file_size_mb * mib))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes, limits.max_processes))
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
    if jail.user_namespace:  # one uid is mapped: the program keeps it, without any capability
        _drop_capabilities()
    else:
        os.setgroups([])
        os.setgid(jail.uid)
        os.setuid(jail.uid)
    os.chdir(jail.root)
    _no_new_namespaces()


def _seccomp_program() -> ctypes.Array:
    """A seccomp filter (classic BPF) that lets the program make no namespace of its own.

    Without it, an unprivileged program can still `unshare(CLONE_NEWUSER)` where the kernel allows
    user namespaces, become root there, and mount a tmpfs or make System V shared memory of any size
    outside its disk budget. So: `unshare` and `setns` fail (EPERM), `clone` fails when it asks for
    a new namespace (a thread or a fork is fine), `clone3` (whose flags a filter cannot read) says
    ENOSYS so that the C library falls back to `clone`, x32 system calls fail, and a system call of
    another architecture kills the process.
    """
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    kill, errno, allow = 0x80000000, 0x00050000, 0x7FFF0000
    m = _MACHINE
    program = [
        (ld, 0, 0, 4),  # the architecture
        (jeq, 1, 0, m.audit_arch),
        (ret, 0, 0, kill),
        (ld, 0, 0, 0),  # the system call's number
        (jge, 0, 1, 0x40000000),
        (ret, 0, 0, errno | 1),
        (jeq, 0, 1, m.clone3),
        (ret, 0, 0, errno | 38),  # ENOSYS
        (jeq, 1, 0, m.unshare),
        (jeq, 0, 1, m.setns),
        (ret, 0, 0, errno | 1),  # EPERM
        (jeq, 0, 3, m.clone),
        (ld, 0, 0, 16),  # clone's flags (the low half of its first argument)
        (jset, 0, 1, _NEW_NAMESPACES),
        (ret, 0, 0, errno | 1),
        (ret, 0, 0, allow),
    ]
    raw = b"".join(struct.pack("=HBBI", *instruction) for instruction in program)
    return ctypes.create_string_buffer(raw, len(raw))


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_SECCOMP = _seccomp_program() if _MACHINE is not None else None
_SECCOMP_FPROG = _SockFprog(len(_SECCOMP) // 8, ctypes.addressof(_SECCOMP)) if _SECCOMP is not None else None


def _no_new_namespaces() -> None:
    """In Y, last thing before exec: no new privileges, and the seccomp filter (`_seccomp_program`)."""
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if _LIBC.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if _LIBC.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(_SECCOMP_FPROG), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def _drop_capabilities() -> None:
    """In Y, in a user namespace where it is uid 0: no capability now or after exec (securebits
    NOROOT, locked; an empty bounding set; no ambient capabilities), so the program is an ordinary
    process of its namespace that owns its own files."""
    pr_set_securebits, pr_capbset_drop, pr_cap_ambient, pr_cap_ambient_clear_all = 28, 24, 47, 4
    noroot, noroot_locked, keep_caps_locked, no_ambient, no_ambient_locked = 1, 2, 32, 64, 128
    if _LIBC.prctl(
        pr_set_securebits, noroot | noroot_locked | keep_caps_locked | no_ambient | no_ambient_locked, 0, 0, 0
    ):
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECUREBITS)")
    for cap in range(64):
        if _LIBC.prctl(pr_capbset_drop, cap, 0, 0, 0) != 0 and ctypes.get_errno() != errno.EINVAL:
            raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap})")
    _LIBC.prctl(pr_cap_ambient, pr_cap_ambient_clear_all, 0, 0, 0)


def _map_ids(inner: int, outer_uid: int, outer_gid: int) -> None:
    """In P's new user namespace: the caller's uid and gid are `inner` there (and nothing else is)."""
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{inner} {outer_uid} 1"),
        ("gid_map", f"{inner} {outer_gid} 1"),
    ):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def _die_with_parent(parent: int | None) -> None:
    """SIGKILL this process when its parent dies: a launcher that dies takes P with it, and P takes
    X, whose end ends the run. `parent`: the parent's pid, to catch one that died already (None for
    X, whose parent is outside its PID namespace: `getppid` says 0 there)."""
    pr_set_pdeathsig = 1
    _LIBC.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if parent is not None and os.getppid() != parent:
        os._exit(_SETUP_EXIT)


def _build_root(jail: _Jail) -> None:
    """In P's new mount namespace: the tmpfs at `jail.root`, the machine's read-only parts bound into
    it at their own paths, the scratch directories, links, /proc's mount point and the work dir."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing below propagates to the machine
    root = jail.root
    options = f"size={jail.disk_mb}m,nr_inodes={_SCRATCH_INODES},mode=0755"
    _mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, options)
    for path in jail.read_only:
        target = root + path
        if os.path.isdir(path):
            os.makedirs(target, 0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o444))
        _mount(path, target, None, _MS_BIND | _MS_REC)
        if not path.startswith("/dev/"):  # a device must stay writable (/dev/null)
            _read_only(target)
    for path, target in jail.links:
        os.makedirs(os.path.dirname(root + path), 0o755, exist_ok=True)
        os.symlink(target, root + path)
    for path in _SCRATCH_DIRS:
        os.makedirs(root + path, 0o755, exist_ok=True)
        os.chmod(root + path, 0o1777)
    os.makedirs(root + "/proc", 0o555, exist_ok=True)
    os.mkdir(root + jail.root, 0o700)
    _write_files(root + jail.root, jail.payload, jail.uid)


def _enter_root(root: str) -> None:
    """In X, the first process of the new PID namespace: make `root` the file system's root (the
    machine's detached), mount this namespace's /proc, turn System V IPC off. /proc is mounted while
    the machine's is still in view: in a user namespace the kernel only allows it then."""
    _mount("proc", root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    old = root + "/.old-root"
    os.mkdir(old, 0o700)
    if _LIBC.syscall(_MACHINE.pivot_root, os.fsencode(root), os.fsencode(old)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"pivot_root({root}): {os.strerror(err)}")
    os.chdir("/")
    if _LIBC.umount2(b"/.old-root", _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount of the machine's root: {os.strerror(err)}")
    os.rmdir("/.old-root")
    for name in _IPC_OFF:
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(f"/proc/sys/{name}", os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
    # read-only from here on: in a user namespace the program is the IPC namespace's owner, whom the
    # kernel lets write those limits back (it checks the uid, not a capability)
    _mount("/proc/sys", "/proc/sys", None, _MS_BIND | _MS_REC)
    _mount(None, "/proc/sys", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    _LIBC.sethostname(b"sandbox", 7)


def _init(program: int, status_write: int) -> None:
    """X's life after forking the program: reap every process of the namespace (orphans come here)
    until the program ends, hand its wait status to P, and exit (which ends the namespace).
    SIGINT back to its default: as the namespace's init, X then ignores every signal sent from
    inside it (the program, in a user namespace, has X's uid)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if pid == program:
                os.write(status_write, status.to_bytes(4, "little"))
                break
    finally:
        os._exit(0)


def _follow(status_read: int, done: int) -> None:
    """P's life after forking X: wait for the program's wait status (from X), reap X, say the run is
    over on `done`, and end the way the program did."""
    try:
        data = b""
        while len(data) < 4:
            chunk = os.read(status_read, 4 - len(data))
            if not chunk:
                break
            data += chunk
        _, x_status = os.waitpid(-1, 0)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        with contextlib.suppress(OSError):
            os.write(done, _DONE)
        status = int.from_bytes(data, "little") if len(data) == 4 else x_status
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            with contextlib.suppress(OSError, ValueError):
                signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
            os._exit(128 + sig)
        os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)
    finally:
        os._exit(1)


def _close_all_but(*keep: int) -> None:
    """Close every descriptor but `keep`: the pipes and `subprocess`'s error pipe are the program's alone."""
    low = 0
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


_READ_ONLY_ATTR = _MountAttr(0x1 | 0x2 | 0x4, 0, 0, 0)
"""MOUNT_ATTR_RDONLY | NOSUID | NODEV."""


def _read_only(target: str) -> None:
    """Make the bind mount at `target` and every mount under it read-only, nosuid, nodev: one
    `mount_setattr(AT_RECURSIVE)` (Linux 5.12+); on an older kernel a remount of the top mount."""
    at_fdcwd, at_recursive = -100, 0x8000
    done = _LIBC.syscall(
        _MACHINE.mount_setattr,
        at_fdcwd,
        os.fsencode(target),
        at_recursive,
        ctypes.byref(_READ_ONLY_ATTR),
        ctypes.sizeof(_MountAttr),
    )
    if done == 0:
        return
    err = ctypes.get_errno()
    if err != errno.ENOSYS:
        raise OSError(err, f"mount_setattr({target}): {os.strerror(err)}")
    _mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    args = [None if x is None else os.fsencode(x) for x in (source, target, fstype)]
    if _LIBC.mount(*args, flags, None if data is None else os.fsencode(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _unshare(flags: int) -> None:
    if _LIBC.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare({flags:#x}): {os.strerror(err)}")


_ISOLATION_FIX = (
    "The local sandbox gives each run new network, IPC, PID and mount namespaces (a root of its own "
    "holding only the interpreter, its libraries and the run's scratch space) and a uid of its own "
    "(as root) or a user namespace of its own (not root). Fix: run the trainer as root, or allow "
    "unprivileged user namespaces (sysctl user.max_user_namespaces above 0; kernel.unprivileged_userns_clone=1 "
    "where that setting exists; kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu 24.04 and later); "
    "in a container, give it CAP_SYS_ADMIN or a seccomp profile that allows unshare and mount; or run "
    "programs elsewhere with worker.reward.code.sandbox=fusion and a SandboxFusion server."
)


@functools.cache
def _prefixes(python: str) -> tuple[str, ...]:
    """The directories `python` needs: its own prefix and, when it is this process's interpreter (a
    virtual environment made with --copies keeps its standard library there), `sys.base_prefix`."""
    prefixes = [os.path.dirname(os.path.dirname(python))]
    if python == os.path.realpath(sys.executable):
        prefixes += [sys.base_prefix, sys.base_exec_prefix]
    return tuple(dict.fromkeys(prefixes))


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
    return _probe() if launcher.IN_LAUNCHER else launcher.pool().ask(("probe",))


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


def _payload(workdir: str, files: dict[str, bytes]) -> dict[str, bytes]:
    """The files of a run (`main.py` included); ValueError for a name outside `workdir`."""
    payload = dict(files)
    for name in payload:
        path = os.path.realpath(os.path.join(workdir, name))
        if not path.startswith(os.path.realpath(workdir) + os.sep):
            raise ValueError(f"sandbox file {name!r} is outside the work directory")
    return payload


def _write_files(workdir: str, payload: dict[str, bytes], uid: int) -> None:
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


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


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


def _failed(why: str, start: float) -> SandboxResult:
    return SandboxResult(
        "sandbox_error", None, "", "", why, time.monotonic() - start, "namespace", None, "private"
    )
