"""Clean stops: SIGINT (Ctrl-C) and SIGTERM (what a cluster scheduler sends before it kills a job) ask
the run to stop at its next safe point, the end of the step in progress, where the run loop
(`run_loop.py`, the same for train, sft and eval) saves a checkpoint and says how to resume; a second signal stops at once. Neither prints a traceback (the
`rlstack` command turns them into one line and the exit status 128 + the signal's number)."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlstack.errors import RLStackError


class RunStopped(RLStackError):
    """The run stopped at a safe point after a signal; `checkpoint` is what it saved (None: nothing)."""

    def __init__(self, message: str, signum: int, checkpoint: Path | None):
        super().__init__(message)
        self.signum, self.checkpoint = signum, checkpoint


def stopped(
    stop: StopRequest, where: str, saved: Path | None, resumes_itself: bool, unsaved_because: str = ""
) -> RunStopped:
    """The error a run raises when a signal stopped it at a safe point: `where` it stopped, the checkpoint
    it `saved` (None: nothing, `unsaved_because`) and how to go on (`resumes_itself`: the same command
    finds it)."""
    if saved is None:
        why = f" ({unsaved_because})" if unsaved_because else ""
        return RunStopped(f"{where}; nothing saved{why}", stop.signum, None)
    how = (
        "the same command resumes from it"
        if resumes_itself
        else f"resume with trainer.load_checkpoint_path={saved}"
    )
    return RunStopped(f"{where}; checkpoint {saved}: {how}", stop.signum, saved)


class Stopped(KeyboardInterrupt):
    """A second signal: the run stops at once, without saving."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopRequest:
    signum: int | None = None
    """The signal that asked the run to stop (None: none yet)."""

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""


@contextmanager
def stop_requests(when: str, at_once: bool = False) -> Iterator[StopRequest]:
    """While inside, SIGINT and SIGTERM set the request (and say once that the run stops `when`: "after
    the step in progress ..."); a second one raises `Stopped`, as does the first with `at_once` (a run
    with nothing to save: `rlstack eval`). Outside the main thread signals cannot be caught: the request never
    fires there."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def handle(signum, frame) -> None:
        if at_once or request.signum is not None:
            raise Stopped(signum)
        request.signum = signum
        print(
            f"\n[rlstack] {signal.Signals(signum).name}: stopping {when}; send it again to stop at once",
            file=sys.stderr,
            flush=True,
        )

    previous = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield request
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
