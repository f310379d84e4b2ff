"""Small helper processes that start sandboxed programs on behalf of the trainer.

Starting a sandboxed program forks the calling process (`subprocess` with a `preexec_fn` cannot use
vfork). Forked from a trainer that holds a model, that copies the page tables of gigabytes: on this
machine a run costs ~73 ms from a process holding 600 MB against ~40 ms from a small one, and a
GPU trainer has a CUDA context that should never be forked at all. So every sandboxed program is
started by a launcher: a plain `python -m rlstack.rewards.sandbox.serve` process (started once, with
vfork, importing only the standard library and the sandbox package). Nothing sandboxed is ever a
fork of the trainer; where no launcher can be had, the run fails (status `sandbox_error`) rather
than starting here.

- One-shot runs (`sandbox.run_python`): the launcher runs `sandbox.run_python_here` and sends back
  the result. One launcher serves one call at a time; concurrent callers (the reward's worker
  threads) each take an idle launcher or start a new one.
- Long-lived programs (`sandbox.SandboxProcess`, the Python tool's interpreter): the launcher starts
  the program and passes the caller its stdin, stdout and stderr pipes (SCM_RIGHTS over the
  launcher's socket); it keeps the process and answers `poll`, `kill_strays` and `close` for it. The
  launcher is the caller's alone until `close`, then goes back to the pool.

Protocol: length-prefixed pickles over a Unix socket pair (both ends are ours; nothing untrusted is
ever unpickled: the sandboxed program's output reaches the launcher as bytes and comes back inside
a `SandboxResult`). A launcher exits when its socket closes (the trainer exited or `shutdown()`
ran), killing the program it holds; a launcher that dies mid-call is replaced.

This module is the caller's side (the protocol and the pool) and imports nothing of the sandbox; the
launcher's own loop, which runs the sandbox's calls, is `rlstack/rewards/sandbox/serve.py`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import socket
import struct
import subprocess
import sys
import threading
from typing import Any

_HEADER = struct.Struct("<QB")
"""A message's length and how many descriptors came with it."""
_MAX_FDS = 3


def _send(sock: socket.socket, obj: Any, fds: tuple[int, ...] = ()) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    header = _HEADER.pack(len(data), len(fds))
    if fds:
        socket.send_fds(sock, [header], list(fds))
    else:
        sock.sendall(header)
    sock.sendall(data)


def _receive(sock: socket.socket) -> tuple[Any, list[int]]:
    header, fds, _, _ = socket.recv_fds(sock, _HEADER.size, _MAX_FDS, socket.MSG_CMSG_CLOEXEC)
    for fd in fds:  # the program's pipes are never inherited by the caller's own children
        os.set_inheritable(fd, False)
    header += _exactly(sock, _HEADER.size - len(header), fds)
    size, _ = _HEADER.unpack(header)
    return pickle.loads(_exactly(sock, size, fds)), fds  # noqa: S301 - our own process on the other end


def _exactly(sock: socket.socket, size: int, fds: list[int]) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            for fd in fds:
                os.close(fd)
            raise EOFError("launcher closed its socket")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class Launcher:
    """One helper process; `call` sends it a request and waits for the answer (and any descriptors)."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "rlstack.rewards.sandbox.serve", str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                env=env,
                close_fds=True,
                pass_fds=(theirs.fileno(),),
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self._lock = threading.Lock()
        self.broken = False
        """A call was cut off between its request and its answer (an exception, Ctrl-C): the socket
        may hold a stale answer, so the launcher is never used again."""

    def call(self, request: tuple) -> tuple[Any, list[int]]:
        with self._lock:
            if self.broken:
                raise OSError(f"launcher pid {self.proc.pid} was cut off in an earlier call")
            try:
                _send(self.sock, request)
                return _receive(self.sock)
            except BaseException:
                self.broken = True
                raise

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class LauncherPool:
    """Idle launchers, handed to one caller at a time; new ones started when all are busy."""

    def __init__(self) -> None:
        self._idle: list[Launcher] = []
        self._all: list[Launcher] = []
        self._lock = threading.Lock()
        self._closed = False

    def run(self, args: tuple) -> Any:
        """`sandbox.run_python_here(*args)` in a launcher; raises `LauncherError` when none can do it."""
        return self.ask(("run", args))

    def acquire(self) -> Launcher:
        """An idle launcher, or a new one: the caller's alone until `release` (or `discard`)."""
        with self._lock:
            if self._closed:
                raise LauncherError("the launcher pool is shut down")
            launcher = self._idle.pop() if self._idle else None
        if launcher is None:
            try:
                launcher = Launcher()
            except OSError as e:
                raise LauncherError(f"cannot start a launcher: {e}") from e
            with self._lock:
                self._all.append(launcher)
        return launcher

    def release(self, launcher: Launcher) -> None:
        if launcher.broken:
            self.discard(launcher)
            return
        with self._lock:
            if self._closed:
                launcher.close()
            else:
                self._idle.append(launcher)

    def ask(self, request: tuple) -> Any:
        """Any launcher's answer to `request` (e.g. `("probe",)`); `LauncherError` when none can give it."""
        launcher = self.acquire()
        try:
            reply, _ = launcher.call(request)
        except (OSError, EOFError, pickle.UnpicklingError) as e:
            self.discard(launcher)
            raise LauncherError(f"launcher pid {launcher.proc.pid} failed: {type(e).__name__}: {e}") from e
        self.release(launcher)
        return reply

    def discard(self, launcher: Launcher) -> None:
        """Stop `launcher` and forget it (it failed, or what it held is in doubt)."""
        with self._lock:
            if launcher in self._all:
                self._all.remove(launcher)
        launcher.close()

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            launchers, self._all, self._idle = self._all, [], []
        for launcher in launchers:
            launcher.close()

    def pids(self) -> list[int]:
        with self._lock:
            return [launcher.proc.pid for launcher in self._all]


class LauncherError(RuntimeError):
    """No launcher could run the call (nothing is then started in the caller: the run fails)."""


_pool: LauncherPool | None = None
_pool_lock = threading.Lock()
IN_LAUNCHER = False
"""True in a launcher process itself (its sandbox module starts runs directly)."""


def _forget_pool_in_child() -> None:
    """A forked child must not share its parent's launchers (their sockets are the parent's)."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_in_child)


def pool() -> LauncherPool:
    """This process's launchers (started lazily, shut down at exit)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = LauncherPool()
            atexit.register(_pool.shutdown)
        return _pool
