"""One run as the process that starts it (a launcher) sees it: the run's handles (`_Run`), the
description of its root (`_jail`), starting P (`_spawn`), watching it to its end (`_run`, `_watch`)
and cleaning up after it.

The wall-clock limit kills the whole process group (SIGKILL, so ignoring SIGTERM does not help),
then every process of the run (its PID namespace, its uid, its cgroup). A run whose memory cgroup
OOM-killed one of its processes is `memory_limit`; the cgroup is removed with the run. stdout/stderr are read incrementally and the run is killed once
either passes `max_output_bytes`.
"""

from __future__ import annotations

import functools
import glob
import os
import selectors
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass

from rlstack.rewards.sandbox import cgroups
from rlstack.rewards.sandbox.child import _DONE, _child_setup, _Jail
from rlstack.rewards.sandbox.limits import SandboxLimits, SandboxResult, _classify
from rlstack.rewards.sandbox.processes import (
    _allocate_uid,
    _kill_all,
    _kill_group,
    _release_uid,
    processes_in_namespace,
    processes_of_uid,
)

_INNER_ID = 0
"""The uid and gid the caller's are mapped to in a run's user namespace (when the caller is not root):
0, which the namespace's System V IPC limits need to be set; the program then runs without any
capability (`_drop_capabilities`)."""
_PAGE = 4096
_SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/fonts")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")
_PACKAGE_DIRS = ("site-packages", "dist-packages")
"""What a directory of installed packages is called: every one in a tree a run sees is hidden from it."""
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_READ_CHUNK = 1 << 16


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
        run.cgroup = cgroups.new(limits.memory_mb)
        jail = _jail(run, {**files, "main.py": script.encode()}, limits, python, read_only)
        return _spawn(python, stdin, limits, jail, run), run
    except BaseException:
        run.release()
        raise


@dataclass
class _Run:
    """One run's handles: its uid, the mount point of its root, its PID namespace, its memory cgroup,
    and the read end of the pipe on which P says the run has ended."""

    uid: int | None
    """The run's own uid (root only); None: the program runs under the caller's uid, mapped into a
    user namespace of its own (`_INNER_ID`)."""
    root: str
    namespace: int | None = None
    """The inode of the run's PID namespace, which finds its processes (read from P right after it
    started; `namespace_fd` keeps the namespace, and so the inode, from being reused meanwhile)."""
    namespace_fd: int | None = None
    done: int | None = None
    cgroup: cgroups._Cgroup | None = None
    """The run's memory cgroup (`cgroups.py`), None where the machine gives none."""

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
        if self.cgroup is not None:
            _kill_all(self.cgroup.processes)

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
        remove its cgroup and the (empty) mount point of its root. Its files went away with its mount
        namespace."""
        if not gone:
            self.kill()
        for fd in (self.done, self.namespace_fd):
            if fd is not None:
                os.close(fd)
        self.done = self.namespace_fd = None
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
        if self.uid is not None:
            _release_uid(self.uid)
        shutil.rmtree(self.root, ignore_errors=True)


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
    out_of_memory = run.cgroup is not None and run.cgroup.out_of_memory()
    status, error_line = _classify(proc.returncode, err, killed_for, limits, out_of_memory)
    return SandboxResult(
        status, proc.returncode, out, err, error_line, wall_s, "namespace", run.uid, "private"
    )


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
    """Check the run's files and describe its file system: the system's trees, the interpreter's
    prefixes and the caller's `read_only` paths bound read-only (a path inside one bound already is
    not bound again), the package directories among them hidden (`_hidden_dirs`), and those of the
    caller's paths that lie inside a hidden directory bound again on top of its mask (a hidden
    directory the caller names itself is not hidden).

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
    for path in _prefixes(python):
        real = os.path.realpath(path)
        if os.path.exists(real) and not _inside(real, shown):
            shown.append(real)
    reals = [real for real in map(os.path.realpath, read_only) if os.path.exists(real)]
    # a hidden directory the caller names itself is shown whole (it lies in a shown tree already)
    hidden = [h for h in _hidden_dirs(python) if h not in reals]
    masks: dict[str, list[str]] = {h: [] for h in hidden}
    for real in sorted(reals, key=len):  # a parent before what lies in it
        mask = next((h for h in hidden if real.startswith(h + os.sep)), None)
        if mask is not None:  # bound on top of its mask: covered by nothing shown before it
            if not _inside(real, masks[mask]):
                masks[mask].append(real)
        elif not _inside(real, shown):
            shown.append(real)
    return _Jail(
        root,
        payload,
        limits.disk_mb,
        tuple(shown),
        links,
        run.program_uid,
        run.uid is None,
        os.getpid(),
        None if run.cgroup is None else run.cgroup.join,
        tuple((h, tuple(inside)) for h, inside in masks.items()),
    )


def _inside(path: str, parents: list[str] | tuple[str, ...]) -> bool:
    """Whether `path` is one of `parents` or lies in one of them."""
    return any(path == p or path.startswith(p + os.sep) for p in parents)


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


@functools.cache
def _hidden_dirs(python: str) -> tuple[str, ...]:
    """The package directories of the trees every run of `python` sees (`_system_paths`, `_prefixes`),
    which the run sees empty (`child._build_root`): each `site-packages` / `dist-packages` under
    `<tree>/lib*/python*`, `<tree>/local/lib*/python*` and `<tree>/python*` (Debian's
    `/usr/lib/python3/dist-packages`, pyenv's or a `--copies` venv's `lib/python3.X/site-packages`,
    ...), those `site` and `sysconfig` name for this interpreter and its base, a conda prefix's
    `pkgs` and `envs`, and the wheels a program could import from (`share/python-wheels`, ensurepip's
    `_bundled`). Python code a machine keeps elsewhere in its system directories (a vendor's SDK under
    `/usr/lib`) stays visible. Real paths, none inside another, none holding a tree (an interpreter installed
    inside one of them keeps its prefix)."""
    system, _ = _system_paths()
    trees = list(
        dict.fromkeys(os.path.realpath(p) for p in (*system, *_prefixes(python)) if os.path.isdir(p))
    )
    found = [
        path
        for tree in trees
        for pattern in ("lib*/python*/*-packages", "local/lib*/python*/*-packages", "python*/*-packages")
        for path in glob.glob(os.path.join(glob.escape(tree), pattern))
    ]
    found += site.getsitepackages([sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix])
    for base in ({}, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}):
        found += [sysconfig.get_path(name, vars=base) for name in ("purelib", "platlib")]
    found = [p for p in found if os.path.basename(p) in _PACKAGE_DIRS]
    for prefix in _prefixes(python):  # a conda installation's package cache and other environments
        if os.path.isdir(os.path.join(prefix, "conda-meta")):
            found += [os.path.join(prefix, "pkgs"), os.path.join(prefix, "envs")]
    # wheels a program could import from directly: Debian's for its venvs, and ensurepip's own
    found += [
        path for tree in trees for path in glob.glob(os.path.join(glob.escape(tree), "share/python-wheels"))
    ]
    found += [
        path
        for tree in trees
        for path in glob.glob(os.path.join(glob.escape(tree), "lib*/python*/ensurepip/_bundled"))
    ]
    hidden: list[str] = []
    for path in sorted({os.path.realpath(p) for p in found if os.path.isdir(p)}, key=len):
        if (
            _inside(path, trees)
            and not _inside(path, hidden)
            and not any(_inside(tree, [path]) for tree in trees)
        ):
            hidden.append(path)
    return tuple(hidden)


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


@functools.cache
def _prefixes(python: str) -> tuple[str, ...]:
    """The directories `python` needs: its own prefix and, when it is this process's interpreter (a
    virtual environment made with --copies keeps its standard library there), `sys.base_prefix`."""
    prefixes = [os.path.dirname(os.path.dirname(python))]
    if python == os.path.realpath(sys.executable):
        prefixes += [sys.base_prefix, sys.base_exec_prefix]
    return tuple(dict.fromkeys(prefixes))


def _payload(workdir: str, files: dict[str, bytes]) -> dict[str, bytes]:
    """The files of a run (`main.py` included); ValueError for a name outside `workdir`."""
    payload = dict(files)
    for name in payload:
        path = os.path.realpath(os.path.join(workdir, name))
        if not path.startswith(os.path.realpath(workdir) + os.sep):
            raise ValueError(f"sandbox file {name!r} is outside the work directory")
    return payload
