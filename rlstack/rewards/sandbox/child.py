"""What runs in the forked child before `exec`: the namespaces, the run's root on its tmpfs and the
limits; `_Jail` is what the parent prepares for it.

Three processes do this (`_child_setup`): P, the forked child, makes the namespaces and builds the
root, forks X (process 1 of the new PID namespace: it enters the root, mounts `/proc`, turns IPC
off) and waits; X forks Y, which sets the limits, drops to the uid and execs the program. P ends
as the program did (its exit status, or its signal), so callers see the program's own status; it
first says on a pipe that it has reaped X, whose end ended every process of the namespace, so a
run that ended by itself needs no search for leftovers. P dies with its launcher and X with P
(`PR_SET_PDEATHSIG`), so a launcher that dies leaves nothing running.

`preexec_fn` runs in the forked child of a launcher (a small single-threaded process), so it only
makes plain system calls (`os.*`, libc's `unshare`, `mount`, `pivot_root` via ctypes; libc is loaded
once, at import) and imports nothing: paths and file contents are prepared in the parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import resource
import signal
from dataclasses import dataclass

from rlstack.rewards.sandbox.kernel import (
    _CLONE_NEWIPC,
    _CLONE_NEWNET,
    _CLONE_NEWNS,
    _CLONE_NEWPID,
    _CLONE_NEWUSER,
    _CLONE_NEWUTS,
    _LIBC,
    _MACHINE,
    _MNT_DETACH,
    _MS_BIND,
    _MS_NODEV,
    _MS_NOEXEC,
    _MS_NOSUID,
    _MS_PRIVATE,
    _MS_RDONLY,
    _MS_REC,
    _MS_REMOUNT,
    _drop_capabilities,
    _map_ids,
    _mount,
    _no_new_namespaces,
    _oom_first,
    _read_only,
    _unshare,
)
from rlstack.rewards.sandbox.limits import _SETUP_EXIT, _SETUP_FAILED, SandboxLimits

_SCRATCH_INODES = 16384
_SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
"""World-writable directories of the program's root (on its tmpfs, so inside `disk_mb`)."""
_IPC_OFF = ("kernel/shmmni", "kernel/shmall", "kernel/msgmni", "fs/mqueue/queues_max")
"""Per-IPC-namespace limits set to 0 in the run's namespace: no System V shared memory or message
queues, no POSIX message queues (POSIX shared memory is files in /dev/shm, inside `disk_mb`)."""
_DONE = b"\x01"
MAX_FILES = 256
"""Open descriptors a process of a run may hold (RLIMIT_NOFILE)."""
_MASK_OPTIONS = "size=4k,nr_inodes=4096,mode=0755"
"""The empty tmpfs over each hidden package directory (`_Jail.masks`): read-only once the mount points
of the caller's paths inside it are made, so its limits only bound those."""


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
    cgroup: str | None = None
    """The file by which P joins the run's memory cgroup, first thing (`cgroups._Cgroup.join`) (so every process and page
    of the run counts there: `cgroups.py`); None where the machine gives none (then `memfd_create` is
    refused)."""
    masks: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(directory, paths in it): the package directories (site-packages, dist-packages) of the trees
    in `read_only` (`runs._hidden_dirs`), each covered by an empty read-only tmpfs, so that the
    program sees none of the packages installed there; the paths in it that the caller shows (the
    Python tool's packages, when they are installed there) are bound on top, at their own paths."""


def _child_setup(limits: SandboxLimits, jail: _Jail, done: int) -> None:
    """Runs in the forked child (P) before exec; see the module docstring for the three processes.

    P: joins the run's memory cgroup (where there is one) and takes oom_score_adj 1000 (both inherited
    by every process of the run), new namespaces (mount, network, IPC, PID, host name) and the run's root built on its tmpfs,
    then P forks X, the first process of the new PID namespace, and only waits. X moves into the
    root (`pivot_root`, the machine's tree detached), mounts the namespace's own /proc, turns System
    V IPC off, and forks Y. X waits too: when Y ends, X passes Y's wait status to P and exits, which
    kills whatever else is left in the namespace. Y sets the limits, drops to the run's uid and
    returns here, so `subprocess` closes the other descriptors and execs the program as Y. P ends
    the way Y ended (the same exit status, or the same signal), after saying on `done` that X (and
    so every process of the run) is gone.
    """
    _die_with_parent(jail.launcher)
    if jail.cgroup is not None:
        _join_cgroup(jail.cgroup)
    _oom_first()
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
    # pipes' and sockets' buffers are no process's address space: without a cgroup, few descriptors
    # is what bounds them
    resource.setrlimit(resource.RLIMIT_NOFILE, (MAX_FILES, MAX_FILES))
    if jail.user_namespace:  # one uid is mapped: the program keeps it, without any capability
        _drop_capabilities()
    else:
        os.setgroups([])
        os.setgid(jail.uid)
        os.setuid(jail.uid)
    os.chdir(jail.root)
    _no_new_namespaces(refuse_memfd=jail.cgroup is None)


def _join_cgroup(path: str) -> None:
    """Move this process (P, before it makes anything; it has one thread) into the run's cgroup, by
    writing "0" (this thread) to `path` (`cgroups._Cgroup.join`): its children are born there."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, b"0")
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
    it at their own paths, the package directories among them masked (`_Jail.masks`), the scratch
    directories, links, /proc's mount point and the work dir."""
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing below propagates to the machine
    root = jail.root
    options = f"size={jail.disk_mb}m,nr_inodes={_SCRATCH_INODES},mode=0755"
    _mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, options)
    for path in jail.read_only:
        _bind(path, root + path)
    for hidden, shown in jail.masks:  # last: on top of whichever bind holds them
        target = root + hidden
        if not shown:
            _mount("tmpfs", target, "tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV, _MASK_OPTIONS)
            continue
        _mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, _MASK_OPTIONS)
        for path in shown:  # their mount points made while the mask is writable
            _bind(path, root + path)
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


def _bind(path: str, target: str) -> None:
    """Bind the machine's `path` at `target` (its mount point made first), read-only but for a device."""
    if os.path.isdir(path):
        os.makedirs(target, 0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o444))
    _mount(path, target, None, _MS_BIND | _MS_REC)
    if not path.startswith("/dev/"):  # a device must stay writable (/dev/null)
        _read_only(target)


def _enter_root(root: str) -> None:
    """In X, the first process of the new PID namespace: make `root` the file system's root (the
    machine's detached), mount this namespace's /proc (read-only once IPC is off), turn System V IPC off. /proc is mounted while
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
    # and /proc read-only as a whole: no process of the run can lower its oom_score_adj (1000, see
    # `_oom_first`) or write any other file of its /proc (its fds, pipes, are not files of /proc)
    _mount(None, "/proc", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
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
