"""The trainer's end of one sandboxed interpreter of `builtin:python` (`tools/python.py`): length-prefixed
JSON requests written to the worker's stdin, replies read from its stdout, its console (stderr) collected
and cut, all under the call's deadline; a reply that cannot be trusted, or a worker that is gone, is `_Lost`."""

from __future__ import annotations

import json
import os
import selectors
import signal
import struct
import time
import weakref
from dataclasses import dataclass
from typing import Any

from rlstack.rewards.sandbox import SandboxProcess

_HEADER = struct.Struct(">I")
_MAX_REPLY_BYTES = 256 << 20
_READ_CHUNK = 1 << 16
_MAX_CHUNKS_PER_READ = 64


@dataclass(frozen=True)
class _Lost:
    """The interpreter is gone (or must be): it ran out of time, died, or sent a corrupt reply."""

    why: str
    timed_out: bool = False


class _Interpreter:
    """The trainer's end of one sandboxed worker: framed requests in, framed replies and console out."""

    def __init__(self, process: SandboxProcess) -> None:
        self.process = process
        self._requests = process.stdin.fileno()
        self._replies = process.stdout.fileno()
        self._console = process.stderr.fileno()
        try:
            for fd in (self._requests, self._replies, self._console):
                os.set_blocking(fd, False)
            pidfd = os.pidfd_open(process.pid)
        except OSError:
            process.close()
            raise
        self._pidfd = pidfd
        self._finalizer = weakref.finalize(self, os.close, pidfd)

    def exchange(self, message: dict, timeout_s: float, max_output_chars: int) -> tuple[dict | _Lost, str]:
        """Send `message`, wait up to `timeout_s` for the reply; (reply or what went wrong, console output)."""
        _read_available(self._console, None)  # what earlier calls' threads printed is not this call's
        console = _Console(max_output_chars)
        try:
            reply = self._await_reply(memoryview(_frame(message)), message.get("id"), timeout_s, console)
        except _Corrupt as e:
            reply = _Lost(f"sent a corrupt reply ({e}; did the code write to the tool's pipes?)")
        except BrokenPipeError:
            reply = self._died()
        except OSError as e:
            reply = _Lost(f"could not be reached ({type(e).__name__}: {e})")
        _read_available(self._console, console)  # what the cell printed before its reply (or its end)
        return reply, console.text()

    def close(self) -> None:
        self._finalizer()
        self.process.close()

    def _await_reply(
        self, request: memoryview, request_id: Any, timeout_s: float, console: _Console
    ) -> dict | _Lost:
        replies = bytearray()
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(self._requests, selectors.EVENT_WRITE)
            for fd in (self._replies, self._console, self._pidfd):
                sel.register(fd, selectors.EVENT_READ)
            while (reply := _take_frame(replies, request_id)) is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return _Lost("timed out", timed_out=True)
                for key, _ in sel.select(remaining):
                    if key.fd == self._requests:
                        request = request[_write_some(key.fd, request) :]
                        if not request:
                            sel.unregister(key.fd)
                    elif key.fd == self._console:
                        if not _read_available(key.fd, console):
                            sel.unregister(key.fd)
                    elif not _read_available(self._replies, replies) or key.fd == self._pidfd:
                        # Gone: only a reply it finished before dying still counts.
                        reply = _take_frame(replies, request_id)
                        return reply if reply is not None else self._died()
        return reply

    def _died(self) -> _Lost:
        for _ in range(100):  # the pipes can close a moment before the process is reapable
            returncode = self.process.poll()
            if returncode is not None:
                return _Lost(_exit_reason(returncode))
            time.sleep(0.01)
        return _Lost("stopped answering (it closed its reply pipe)")


def _take_frame(buf: bytearray, request_id: Any) -> dict | None:
    """The reply at the start of `buf` once it is complete (and consume it); `_Corrupt` when it is not one."""
    if len(buf) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack_from(buf)
    if size > _MAX_REPLY_BYTES:
        raise _Corrupt(f"a frame of {size} bytes")
    if len(buf) < _HEADER.size + size:
        return None
    if len(buf) > _HEADER.size + size:
        raise _Corrupt("bytes after the reply")
    try:
        reply = json.loads(bytes(buf[_HEADER.size :]))
    except ValueError as e:
        raise _Corrupt(f"not JSON: {e}") from e
    del buf[:]
    return _checked(reply, request_id)


def _checked(reply: Any, request_id: Any) -> dict:
    """`reply` when it has the shape the worker sends (see python_worker.py), else `_Corrupt`."""
    if not isinstance(reply, dict):
        raise _Corrupt("not an object")
    if request_id is None:  # the init reply
        return reply
    shape = {
        "id": int,
        "ok": bool,
        "error": (str, type(None)),
        "traceback": (str, type(None)),
        "value": (str, type(None)),
        "images": list,
        "dropped_images": int,
        "notes": list,
    }
    wrong = [key for key, kind in shape.items() if not isinstance(reply.get(key), kind)]
    if wrong or reply["id"] != request_id:
        raise _Corrupt(f"unexpected fields {wrong}" if wrong else f"the reply to request {reply['id']}")
    if not all(isinstance(x, str) for x in reply["images"] + reply["notes"]):
        raise _Corrupt("images and notes must be strings")
    if not reply["ok"] and (reply["traceback"] is None or reply["error"] is None):
        raise _Corrupt("an error without its traceback")
    return reply


def _exit_reason(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with status {returncode} (did the code call os._exit or close the tool's pipes?)"
    sig = signal.Signals(-returncode)
    if sig == signal.SIGXCPU:
        return "used up its CPU time budget (SIGXCPU)"
    if sig == signal.SIGKILL:
        return "was killed (SIGKILL: out of memory or past its CPU time budget)"
    return f"crashed ({sig.name})"


class _Console:
    """The first `max_chars` characters of a call's console output, and how much more there was."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.head = bytearray()
        self.total = 0

    def __iadd__(self, chunk: bytes) -> _Console:
        self.total += len(chunk)
        room = 4 * self.max_chars - len(self.head)  # a character is at most 4 bytes of UTF-8
        if room > 0:
            self.head += chunk[:room]
        return self

    def text(self) -> str:
        text = self.head.decode(errors="replace")
        if len(text) <= self.max_chars and self.total == len(self.head):
            return text
        return (
            text[: self.max_chars]
            + f"\n[output truncated to {self.max_chars} characters; {self.total} bytes in all]"
        )


def _read_available(fd: int, sink: bytearray | _Console | None) -> bool:
    """Read what `fd` holds now into `sink` (None: discard); False at end of file.

    At most `_MAX_CHUNKS_PER_READ` chunks, so that code printing as fast as we read cannot keep the
    trainer from checking its deadline.
    """
    for _ in range(_MAX_CHUNKS_PER_READ):
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        if sink is not None:
            sink += chunk
    return True


def _write_some(fd: int, data: memoryview) -> int:
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0


def _frame(message: dict) -> bytes:
    body = json.dumps(message).encode()
    return _HEADER.pack(len(body)) + body


class _Corrupt(Exception):
    """A reply the trainer cannot trust: the interpreter is stopped and the call reported as lost."""
