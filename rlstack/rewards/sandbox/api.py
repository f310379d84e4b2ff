"""The sandbox's entry points: `run_python` (one program, run to its end) and `SandboxProcess` (a
long-lived one), each asked of a launcher process (`rlstack/rewards/launcher.py`), and the forms a
launcher runs itself, from its own process (`run_python_here`, `LocalProcess`).

`SandboxProcess` is the long-lived form (the agent's Python interpreter tool): the same isolation and
clean-up, but the program keeps running between exchanges and talks to its caller over its stdin
and stdout pipes (passed to the caller by the launcher); stderr is its console. Its CPU limit is a
budget for its whole life; wall-clock and output limits are per exchange, so they are the caller's
to enforce.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import threading
import time
import weakref
from typing import Any

from rlstack.rewards import launcher
from rlstack.rewards.sandbox.limits import DEFAULT_LIMITS, SandboxLimits, SandboxResult, _failed
from rlstack.rewards.sandbox.probe import _interpreter, isolation_problem
from rlstack.rewards.sandbox.processes import _kill_all, _kill_group, _pid_in_namespace
from rlstack.rewards.sandbox.runs import _Run, _run, _start


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
        stdin_fd = _sealed(stdin.encode())
        try:
            proc, run = _start(python, code, files or {}, limits, (), stdin_fd)
        finally:
            os.close(stdin_fd)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return _failed(f"{type(e).__name__}: {e}", start)
    try:
        return _run(proc, run, limits, start)
    finally:
        run.release(gone=True)


def _sealed(data: bytes) -> int:
    """A read-only file holding `data`, at offset 0: the program's stdin. A memfd of this process (not
    a file on the machine's disk), sealed against writing, growing and shrinking, so that the program
    can neither write into it nor store anything there (it could reopen /proc/self/fd/0 for writing)."""
    fd = os.memfd_create("rlstack-stdin", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


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
        self._ended = _Ended(pool, helper)
        self._lock = threading.Lock()
        """One call to the launcher at a time: a thread left reading the pipes may close while another stops."""
        self._finalizer = weakref.finalize(
            self, _close_remote, self._ended, (self.stdin, self.stdout, self.stderr)
        )

    def poll(self) -> int | None:
        """The exit status once the program has exited (negative: killed by that signal), else None."""
        with self._lock:
            if self._returncode is None and self._ended.done:
                self._returncode = self._ended.returncode
            elif self._returncode is None and self._finalizer.alive:
                self._returncode = self._ask("poll")
            return self._returncode

    def kill_strays(self) -> None:
        """Kill every process of the run except the program itself (children it left running)."""
        with self._lock:
            if self._finalizer.alive and not self._ended.done:
                self._ask("kill_strays")

    def stop(self) -> None:
        """Kill the program and everything of its run and remove its files, but keep our ends of its pipes
        open (`close` closes them): a thread still reading them then reads their end, not a descriptor
        closed under it, whose number the next file this process opens would take (idempotent)."""
        with self._lock:
            if self._finalizer.alive:
                self._ended.end()

    def close(self) -> int | None:
        """Kill the program and everything of its run, remove its files; its exit status (idempotent)."""
        with self._lock:
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


class _Ended:
    """A run's end, asked of its launcher once: the run killed and its files removed, the launcher given back."""

    def __init__(self, pool: launcher.LauncherPool, helper: launcher.Launcher) -> None:
        self.pool, self.helper = pool, helper
        self.done = False
        self.returncode: int | None = None

    def end(self) -> int | None:
        if not self.done:
            self.done = True
            try:
                self.returncode = self.helper.call(("close",))[0]
            except (OSError, EOFError):
                self.pool.discard(self.helper)
            else:
                self.pool.release(self.helper)
        return self.returncode


def _close_remote(ended: _Ended, pipes: tuple) -> int | None:
    """Close our ends of the pipes, have the launcher end the run (unless `stop` did), give the launcher back."""
    for pipe in pipes:
        with contextlib.suppress(OSError):
            pipe.close()
    return ended.end()


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
