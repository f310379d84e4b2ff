"""The launcher process: `python -m rlstack.rewards.sandbox.serve FD`, started by a `Launcher`
(`rlstack/rewards/launcher.py`, which is the caller's side: the pool and the protocol). It answers
the caller's requests on the socket FD (`run`, `start`, `probe` (with `weaker_limits`), `poll`, `kill_strays`, `close`) by
running them here, in this small process, and exits when the socket closes, ending the program it holds."""

from __future__ import annotations

import signal
import socket
import sys

from rlstack.rewards import launcher
from rlstack.rewards.launcher import _receive, _send
from rlstack.rewards.sandbox.api import LocalProcess, run_python_here
from rlstack.rewards.sandbox.probe import isolation_problem, weaker_limits


def _serve(fd: int) -> None:
    """The launcher's loop: answer each request in this (small) process; exit when the socket closes."""
    launcher.IN_LAUNCHER = True  # the flag the sandbox reads (probe.py): this process starts runs itself

    sock = socket.socket(fileno=fd)
    sys.stdout = sys.stderr  # nothing but answers on the socket
    process: LocalProcess | None = None
    try:
        while True:
            try:
                request, _ = _receive(sock)
            except EOFError:
                return
            kind, fds = request[0], ()
            if kind == "run":
                reply = run_python_here(*request[1])
            elif kind == "start":
                try:
                    process = LocalProcess(*request[1])
                except (OSError, ValueError) as e:
                    reply = ("error", type(e).__name__, str(e))
                else:
                    fds = (process.stdin.fileno(), process.stdout.fileno(), process.stderr.fileno())
                    reply = ("started", process.pid, process.uid, process.workdir)
            elif kind == "probe":  # and what the machine cannot give (said once, by the caller)
                reply = (isolation_problem(), weaker_limits())
            elif kind == "poll":
                reply = process.poll()
            elif kind == "kill_strays":
                reply = process.kill_strays()
            else:  # "close"
                reply = process.close() if process is not None else None
                process = None
            _send(sock, reply, fds)
            if fds:  # the caller holds them now: the program's end of file is its alone to see
                for pipe in (process.stdin, process.stdout, process.stderr):
                    pipe.close()
    finally:
        if process is not None:
            process.close()


if __name__ == "__main__":
    # A terminal's Ctrl-C reaches the whole process group: the trainer decides when to stop (at the end
    # of its step, `rlstack/stops.py`), and this helper serves it until then.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _serve(int(sys.argv[1]))
