"""The processes and uids of runs: listing a run's live processes (by its PID namespace, or its uid),
killing them all, and reserving a uid that no process has and no other run holds."""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import signal
import tempfile
import threading
import time
from collections.abc import Callable

_UID_BASE = 200_000
_UID_RANGE = 60_000


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
