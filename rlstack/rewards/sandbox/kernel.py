"""The sandbox's system calls through libc (`ctypes`): the namespace and mount flags, the system call
numbers of each supported machine, `mount` / `unshare` / read-only bind mounts, the user namespace's
id map, what leaves the program no privilege of its own (the seccomp filter that refuses new
namespaces and the keyrings, the dropped capabilities), and its OOM score. All of it is plain system calls, safe in the forked child."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from typing import NamedTuple

_CLONE_NEWUSER = 0x10000000
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
    keyring: tuple[int, ...]
    """add_key, request_key, keyctl."""
    memfd: tuple[int, ...]
    """memfd_create, memfd_secret."""
    mount_setattr: int = 442


_MACHINES = {
    "x86_64": _Machine(
        0xC000003E,
        pivot_root=155,
        clone=56,
        clone3=435,
        unshare=272,
        setns=308,
        keyring=(248, 249, 250),
        memfd=(319, 447),
    ),
    "aarch64": _Machine(
        0xC00000B7,
        pivot_root=41,
        clone=220,
        clone3=435,
        unshare=97,
        setns=268,
        keyring=(217, 218, 219),
        memfd=(279, 447),
    ),
}
_MACHINE = _MACHINES.get(os.uname().machine)
_NEW_NAMESPACES = 0x10000000 | 0x00020000 | 0x20000000 | 0x40000000 | 0x08000000 | 0x04000000 | 0x02000000
"""CLONE_NEWUSER, NEWNS, NEWPID, NEWNET, NEWIPC, NEWUTS, NEWCGROUP: what `clone` may not ask for."""
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_LIBC.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _seccomp_program(refuse_memfd: bool) -> ctypes.Array:
    """A seccomp filter (classic BPF) that lets the program make no namespace of its own, and use no
    kernel keyring (nor, with `refuse_memfd`, make memory-backed files outside its disk budget).

    Without it, an unprivileged program can still `unshare(CLONE_NEWUSER)` where the kernel allows
    user namespaces, become root there, and mount a tmpfs or make System V shared memory of any size
    outside its disk budget. So: `unshare` and `setns` fail (EPERM), `clone` fails when it asks for
    a new namespace (a thread or a fork is fine), `clone3` (whose flags a filter cannot read) says
    ENOSYS so that the C library falls back to `clone`, x32 system calls fail, and a system call of
    another architecture kills the process.

    The kernel keyrings (`add_key`, `request_key`, `keyctl`: EPERM) are the uid's, not the run's: a
    key added there would outlive the run and be read by a later run given the same uid. And where
    the run has no memory cgroup (`cgroups.problem()`), `memfd_create` and `memfd_secret` fail
    (EPERM): their pages are in no process's address space and on no disk budget, so nothing else
    would bound them.
    """
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    kill, errno, allow = 0x80000000, 0x00050000, 0x7FFF0000
    m = _MACHINE
    refused = (m.unshare, m.setns, *m.keyring, *(m.memfd if refuse_memfd else ()))
    program = [
        (ld, 0, 0, 4),  # the architecture
        (jeq, 1, 0, m.audit_arch),
        (ret, 0, 0, kill),
        (ld, 0, 0, 0),  # the system call's number
        (jge, 0, 1, 0x40000000),
        (ret, 0, 0, errno | 1),
        (jeq, 0, 1, m.clone3),
        (ret, 0, 0, errno | 38),  # ENOSYS
    ]
    for number in refused:
        program += [(jeq, 0, 1, number), (ret, 0, 0, errno | 1)]  # EPERM
    program += [
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


def _fprog(refuse_memfd: bool) -> tuple[ctypes.Array, _SockFprog]:
    program = _seccomp_program(refuse_memfd)
    return program, _SockFprog(len(program) // 8, ctypes.addressof(program))


_SECCOMP = {refuse: _fprog(refuse) for refuse in (False, True)} if _MACHINE is not None else {}
"""refuse_memfd -> (the program, its sock_fprog): made at import, so the forked child builds nothing."""


def _no_new_namespaces(refuse_memfd: bool = True) -> None:
    """In Y, last thing before exec: no new privileges, and the seccomp filter (`_seccomp_program`)."""
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if _LIBC.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    _, fprog = _SECCOMP[refuse_memfd]
    if _LIBC.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def _oom_first() -> None:
    """In P, first: oom_score_adj 1000 (inherited by every process of the run), so that the kernel's
    OOM killer takes a process of a run before anything else of the machine (the trainer). No process
    of the run can lower it again: its /proc is read-only (`child._enter_root`)."""
    fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
    try:
        os.write(fd, b"1000")
    finally:
        os.close(fd)


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
