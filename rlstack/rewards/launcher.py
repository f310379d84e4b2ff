"""Small helper processes that start sandboxed runs on behalf of the trainer.

Starting a sandboxed program forks the calling process (`subprocess` with a `preexec_fn` cannot use
vfork). Forked from a trainer that holds a model, that copies the page tables of gigabytes: on this
machine a run costs ~73 ms from a process holding 600 MB against ~40 ms from a small one, and a
GPU trainer has a CUDA context that should never be forked at all. So `sandbox.run_python` hands its
runs to launchers: plain `python -m rlstack.rewards.launcher` processes (started once, with vfork,
importing only the standard library and the sandbox module) that run `sandbox.run_python_here` and
send back the result. One launcher serves one run at a time; concurrent callers (the reward's
worker threads) each take an idle launcher or start a new one.

Protocol: length-prefixed pickles over the launcher's stdin/stdout (both ends are ours; nothing
untrusted is ever unpickled: the sandboxed program's output reaches the launcher as bytes and comes
back inside a `SandboxResult`). A launcher exits when its stdin closes (the trainer exited or
`shutdown()` ran); a launcher that dies mid-run is replaced, and that run is done in process.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import struct
import subprocess
import sys
import threading
from typing import Any

_HEADER = struct.Struct("<Q")


def _write(stream, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read(stream) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("launcher closed its pipe")
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("launcher closed its pipe mid-message")
    return pickle.loads(data)  # noqa: S301 - our own process on the other end


class Launcher:
    """One helper process; `run` sends it a call and waits for the answer."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlstack.rewards.launcher"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )

    def run(self, args: tuple) -> Any:
        _write(self.proc.stdin, args)
        return _read(self.proc.stdout)

    def close(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()
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
        try:
            result = launcher.run(args)
        except (OSError, EOFError, pickle.UnpicklingError) as e:
            self._discard(launcher)
            raise LauncherError(f"launcher pid {launcher.proc.pid} failed: {type(e).__name__}: {e}") from e
        with self._lock:
            if self._closed:
                launcher.close()
            else:
                self._idle.append(launcher)
        return result

    def _discard(self, launcher: Launcher) -> None:
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
    """No launcher could run the call (the caller then runs it in process)."""


_pool: LauncherPool | None = None
_pool_lock = threading.Lock()


def pool() -> LauncherPool:
    """This process's launchers (started lazily, shut down at exit)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = LauncherPool()
            atexit.register(_pool.shutdown)
        return _pool


def _serve() -> None:
    """The launcher's loop: run each call in this (small) process, answer, exit on end of input."""
    from rlstack.rewards.sandbox import run_python_here

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but answers on the pipe
    while True:
        try:
            args = _read(stdin)
        except EOFError:
            return
        _write(stdout, run_python_here(*args))


if __name__ == "__main__":
    _serve()
