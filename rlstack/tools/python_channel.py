"""The trainer's end of one sandboxed interpreter of `builtin:python` (`tools/python.py`): length-prefixed
requests written to the worker's stdin, replies read from its stdout, its console (stderr) collected and
cut, all under the call's deadline; a reply that cannot be trusted, or a worker that is gone, is `_Lost`.

Everything read here is hostile. A cell runs inside the worker process, so it can write anything on any
of the worker's descriptors (frames of its own on the reply pipe included), read the requests, or
replace the worker's code. What holds whatever it does:

- Bounded reads. A frame is read only up to the length its header announces, and a header announcing
  more than `ReplyLimits` allows (the JSON part of a reply, each PNG, the number of PNGs) makes the
  reply corrupt before any of its body is read: the trainer holds at most one reply's limits, never
  the excess, and the interpreter is stopped. The console is read to its end (so the cell does not
  block) but only its first `4 * max_output_chars` bytes are kept.
- A frame is what the cell produced, no more. `_Reply`'s fields are checked for their types only;
  the tool (`python.py`) cuts their text to `max_output_chars` with the console's, decodes at most
  `ReplyLimits.images` PNGs and checks each one's pixel count before decoding it, and writes its own
  notes (truncation, refused images, time-outs) from what it measured, never from a frame's text.
- Calls stay in step. A reply counts for request `id` only when it carries that id and the worker has
  taken the whole request off its pipe (the pipe's unread bytes, FIONREAD, are 0) by the time the
  reply is complete. Replies with another id (an earlier call's reply left behind after the cell
  forged its own, one forged for a later call) and a reply completed before the request was taken
  (sent ahead by an earlier cell) are read, within the limits, and dropped. So a forged frame can
  only stand in for the reply of the call whose cell is running, which is no more than that cell
  printing its text; it cannot answer a later call or leave the next one out of step. Dropped
  frames do not extend the call: its deadline holds however many arrive. Bytes that are not frames
  make the reply corrupt: the interpreter is stopped and the next call starts a new one.
"""

from __future__ import annotations

import array
import fcntl
import json
import os
import selectors
import signal
import struct
import termios
import threading
import time
import weakref
from dataclasses import dataclass

from rlstack.rewards.sandbox import SandboxProcess, signal_name

_HEADER = struct.Struct(">I")
_READ_CHUNK = 1 << 16
_MAX_CHUNKS_PER_READ = 64
_MAX_DROPPED_IMAGES = 1 << 31


@dataclass(frozen=True)
class ReplyLimits:
    """The most the trainer reads of one reply; each is checked on a frame's header, before its body."""

    text_bytes: int
    """The reply's JSON frame (the init reply's too)."""
    image_bytes: int
    """Each PNG frame."""
    images: int
    """PNG frames after the JSON frame."""

    @classmethod
    def of(cls, max_output_chars: int, max_images: int, max_pixels: int) -> ReplyLimits:
        """Limits an honest worker (`python_worker.py`) stays within: its texts of at most
        `max_output_chars` characters (a few more for its own `... [n more characters]`; at most 12
        bytes each in ASCII JSON: a surrogate pair escaped), value, traceback, error and a note per
        image; PNGs of RGB images of at most `max_pixels` (3 bytes a pixel, a filter byte a row, and
        zlib's and the chunks' overhead)."""
        texts = 3 + max_images
        return cls(
            text_bytes=12 * (max_output_chars + 600) * texts + 4096,
            image_bytes=4 * max_pixels + max_pixels // 64 + (1 << 16),
            images=max_images,
        )


@dataclass(frozen=True)
class _Reply:
    """A cell's reply as the worker (or the cell) sent it; only its types are checked."""

    ok: bool
    error: str | None
    traceback: str | None
    value: str | None
    notes: tuple[str, ...]
    dropped_images: int
    pngs: tuple[bytes, ...]
    evaluated: bool = False
    """The cell ended with an expression, which ran without error (NeMo RL's code environment's test)."""


@dataclass(frozen=True)
class _Lost:
    """The interpreter is gone (or must be): it ran out of time, died, or sent a corrupt reply."""

    why: str
    timed_out: bool = False


class _Interpreter:
    """The trainer's end of one sandboxed worker: framed requests in, framed replies and console out."""

    def __init__(self, process: SandboxProcess, limits: ReplyLimits) -> None:
        self.process = process
        self.limits = limits
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
        self._guard = threading.Lock()
        self._busy = False
        self.stopped = False
        """`close` ran: no exchange starts any more (one in flight ends with the program)."""

    def exchange(
        self, message: dict, timeout_s: float, max_output_chars: int
    ) -> tuple[_Reply | dict | _Lost, _Console]:
        """Send `message`, wait up to `timeout_s` for its reply; (the reply, or what went wrong; the console).

        The reply is a `_Reply` for a cell's request (one with an `id`), the init reply's dict otherwise."""
        with self._guard:
            if self.stopped:
                return _Lost("was stopped"), _Console(max_output_chars)
            self._busy = True
        try:
            return self._exchange(message, timeout_s, max_output_chars)
        finally:
            with self._guard:
                self._busy = False
                release = self.stopped
            if release:  # `close` ran in another thread meanwhile: the pipes are this thread's to close
                self._release()

    def _exchange(
        self, message: dict, timeout_s: float, max_output_chars: int
    ) -> tuple[_Reply | dict | _Lost, _Console]:
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
        return reply, console

    def close(self) -> None:
        """Stop the program and close its pipes. From another thread than one in `exchange` (a call the agent
        loop stopped waiting for), the program is stopped here and that thread closes the pipes as it returns
        (which the program's end makes prompt): closed under it, a pipe's number would go to the next file
        this process opens, and that thread would read, blocking, from a stranger's file."""
        with self._guard:
            busy, self.stopped = self._busy, True
        if busy:
            self.process.stop()
        else:
            self._release()

    def _release(self) -> None:
        self._finalizer()
        self.process.close()

    def _await_reply(
        self, request: memoryview, request_id: int | None, timeout_s: float, console: _Console
    ) -> _Reply | dict | _Lost:
        frames = _Frames(self._replies)
        unit = _Unit(request_id, self.limits)
        deadline = time.monotonic() + timeout_s
        gone = False
        with selectors.DefaultSelector() as sel:
            sel.register(self._requests, selectors.EVENT_WRITE)
            for fd in (self._replies, self._console, self._pidfd):
                sel.register(fd, selectors.EVENT_READ)
            while True:
                try:
                    body = frames.next(unit.limit(), unit.what())
                except EOFError:
                    return self._died()
                if body is not None:
                    reply = unit.add(body, taken=not request and _unread(self._requests) == 0)
                    if reply is not None:
                        return reply
                elif gone:  # it died and nothing more is there: only a reply it finished counts
                    return self._died()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return _Lost("timed out", timed_out=True)
                # After a frame that was not the reply, only a look: more may be waiting already.
                for key, _ in sel.select(remaining if body is None else 0):
                    if key.fd == self._requests:
                        request = request[_write_some(key.fd, request) :]
                        if not request:
                            sel.unregister(key.fd)
                    elif key.fd == self._console:
                        if not _read_available(key.fd, console):
                            sel.unregister(key.fd)
                    elif key.fd == self._pidfd:
                        gone = True
                        sel.unregister(key.fd)

    def _died(self) -> _Lost:
        for _ in range(100):  # the pipes can close a moment before the process is reapable
            returncode = self.process.poll()
            if returncode is not None:
                return _Lost(_exit_reason(returncode))
            time.sleep(0.01)
        return _Lost("stopped answering (it closed its reply pipe)")


class _Frames:
    """Frames off the reply pipe, read no further than the one being read: its header, then exactly the
    length the header announced, which must be within the caller's limit."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()
        self.size: int | None = None  # the body's length, once the header is in

    def next(self, limit: int, what: str) -> bytes | None:
        """The next frame's body once all of it is in, else None (nothing more to read now; at most
        `_MAX_CHUNKS_PER_READ` reads per call, so a fast writer cannot keep the caller from its
        deadline). `_Corrupt` when its header announces more than `limit` bytes (none of them read);
        EOFError at the end of the pipe."""
        for _ in range(_MAX_CHUNKS_PER_READ):
            if self.size is not None and len(self.buf) == self.size:
                body, self.buf, self.size = bytes(self.buf), bytearray(), None
                return body
            want = (_HEADER.size if self.size is None else self.size) - len(self.buf)
            try:
                chunk = os.read(self.fd, min(want, _READ_CHUNK))
            except BlockingIOError:
                return None
            if not chunk:
                raise EOFError
            self.buf += chunk
            if self.size is None and len(self.buf) == _HEADER.size:
                (size,) = _HEADER.unpack(self.buf)
                if size > limit:
                    raise _Corrupt(f"{what} of {size} bytes, more than the {limit} allowed")
                self.buf, self.size = bytearray(), size
        return None


class _Unit:
    """One reply as its frames come in: its JSON, then the PNGs it announced. Replies that are not the
    request's (see the module docstring) are read the same way, within the same limits, and dropped."""

    def __init__(self, request_id: int | None, limits: ReplyLimits) -> None:
        self.request_id, self.limits = request_id, limits
        self.message: dict | None = None
        self.current = False
        self.pngs: list[bytes] = []
        self.left = 0  # PNG frames still to come

    def limit(self) -> int:
        return self.limits.image_bytes if self.left else self.limits.text_bytes

    def what(self) -> str:
        return "an image" if self.left else "a reply"

    def add(self, body: bytes, taken: bool) -> _Reply | dict | None:
        """Take the next frame; the request's reply once it is complete. `taken`: the worker has read the
        whole request by now."""
        if self.left:
            self.left -= 1
            if self.current:
                self.pngs.append(body)
        else:
            message = _parse(body)
            if self.request_id is None:  # the init reply: no cell has run yet
                return message
            reply_id, images = message.get("id"), message.get("images")
            if type(reply_id) is not int or type(images) is not int or images < 0:
                raise _Corrupt("a reply without its id and number of images")
            if images > self.limits.images:
                raise _Corrupt(f"a reply of {images} images, more than the {self.limits.images} allowed")
            self.current = reply_id == self.request_id and taken
            self.message, self.pngs, self.left = message, [], images
        if self.left or not self.current:
            return None
        assert self.message is not None
        return _checked(self.message, tuple(self.pngs))


def _parse(body: bytes) -> dict:
    try:
        message = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise _Corrupt(f"not JSON: {type(e).__name__}") from e
    if not isinstance(message, dict):
        raise _Corrupt("not an object")
    return message


def _checked(reply: dict, pngs: tuple[bytes, ...]) -> _Reply:
    """`reply` when it has the shape the worker sends (see python_worker.py), else `_Corrupt`."""
    shape = {
        "ok": bool,
        "error": (str, type(None)),
        "traceback": (str, type(None)),
        "value": (str, type(None)),
        "dropped_images": int,
        "notes": list,
    }
    wrong = [key for key, kind in shape.items() if not isinstance(reply.get(key), kind)]
    if wrong:
        raise _Corrupt(f"unexpected fields {wrong}")
    if not isinstance(reply.get("evaluated", False), bool):
        raise _Corrupt("evaluated must be true or false")
    if not all(isinstance(x, str) for x in reply["notes"]):
        raise _Corrupt("notes must be strings")
    if not reply["ok"] and (reply["traceback"] is None or reply["error"] is None):
        raise _Corrupt("an error without its traceback")
    if not 0 <= reply["dropped_images"] < _MAX_DROPPED_IMAGES or isinstance(reply["dropped_images"], bool):
        raise _Corrupt("a wrong number of dropped images")
    return _Reply(
        ok=reply["ok"],
        error=reply["error"],
        traceback=reply["traceback"],
        value=reply["value"],
        notes=tuple(reply["notes"]),
        dropped_images=reply["dropped_images"],
        pngs=pngs,
        evaluated=reply.get("evaluated", False),  # a reply without it (a cell's own frames): not evaluated
    )


def _unread(fd: int) -> int:
    """Bytes written to the pipe `fd` (our end) that its reader has not read yet; 0 when unknown."""
    count = array.array("i", [0])
    try:
        fcntl.ioctl(fd, termios.FIONREAD, count)
    except OSError:
        return 0
    return count[0]


def _exit_reason(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with status {returncode} (did the code call os._exit or close the tool's pipes?)"
    sig = -returncode
    if sig == signal.SIGXCPU:
        return "used up its CPU time budget (SIGXCPU)"
    if sig == signal.SIGKILL:
        return "was killed (SIGKILL: out of memory or past its CPU time budget)"
    return f"crashed ({signal_name(sig)})"


class _Console:
    """The first `4 * max_chars` bytes of a call's console output (enough for `max_chars` characters),
    and how many bytes there were in all."""

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

    def kept(self) -> str:
        """What was kept, decoded; may be more than `max_chars` characters (the caller cuts it)."""
        return self.head.decode(errors="replace")

    def cut(self) -> bool:
        """Whether bytes were read that were not kept."""
        return self.total > len(self.head)

    def text(self) -> str:
        """At most `max_chars` characters, and a note when there was more."""
        text = self.kept()
        if len(text) <= self.max_chars and not self.cut():
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
