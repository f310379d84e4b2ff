"""`builtin:python`: a notebook-like Python interpreter per trajectory, in the sandbox (CodeV / PyVision).

What the model gets (also in `PythonTool.schema`'s description):

- One interpreter per trajectory: variables, imports and files persist across its calls and are
  invisible to other trajectories.
- The input images are preloaded: as PIL images `image_1`, `image_2`, ... in the namespace and as
  files `image_1.png`, `image_2.png`, ... in the working directory.
- Pillow, NumPy and Matplotlib (Agg backend) are importable.
- The reply holds what the code printed (stdout and stderr together, cut to `max_output_chars`), the
  repr of a final expression's value, the last lines of the traceback when it raised, and as images
  every figure shown with `plt.show()` / `fig.show()`, every `Image.show()`, and a final expression
  that is a PIL image or a figure; at most `max_images_per_call`, each resized to
  [`min_pixels`, `max_pixels`] (`fit_image`).
- A call that runs past `timeout_s`, crashes the interpreter (segfault, `os._exit`) or uses up its
  CPU budget `cpu_s` ends with an observation that says so and that the state is lost; the next call
  starts a fresh interpreter. Running out of memory (`MemoryError`), writing a file past
  `file_size_mb` (`OSError: File too large`) or more than `disk_mb` in all (`OSError: No space left
  on device`, with a note naming the budget) are ordinary exceptions that keep the state. Processes
  a call starts do not outlive the call; threads do (the CPU budget bounds them).
- Scratch space is private: the working directory, `/tmp`, `/var/tmp` and `/dev/shm` are on one
  tmpfs of `disk_mb` MiB, the interpreter's own root, so a file one trajectory writes in `/tmp` is
  not there for another, and the machine's files (datasets, checkpoints, the project) are not there
  at all (`rewards/sandbox.py`).

Cost: an interpreter starts on the first call of its trajectory (about 0.1 s: it imports only
Pillow; NumPy and Matplotlib, most of a second together, are imported by the cells that use them,
and `plt.show()` is hooked at that moment) and holds about 17 MB of memory (66 MB once a cell
imports Matplotlib) until `close()`; a batch of trajectories in flight holds one each.

Where the code runs: never in the trainer, and never in a fork of it. Each interpreter is
`tools/python_worker.py` in a `SandboxProcess` (`rewards/sandbox.py`), started by a launcher
process of its own that passes back its pipes: own uid, own root with only the interpreter, its
libraries and the packages below (read-only) and its scratch space; own PID namespace and /proc,
own IPC namespace, no network; rlimits on address space (`memory_mb`), file size
(`file_size_mb`), processes (`max_processes`) and CPU; a scrubbed environment. Trainer and worker
exchange length-prefixed JSON frames over the worker's stdin/stdout (images as base64 PNG); the
worker moves that protocol off fds 0-2 before any user code runs, so printing cannot corrupt it,
and the trainer treats any reply it cannot parse as a crash.

Pillow, NumPy and Matplotlib come from the trainer's own environment: the worker appends the
directories the trainer imports them from to `sys.path`. The sandbox's interpreter is the trainer's
when the sandbox uid can run it (every directory from its prefix down world-searchable), else the
system `python3`; their C extensions load when its minor version matches the trainer's. The
package directories are bound, read-only, into the interpreter's root at their own paths. When the
sandbox uid cannot read them (a venv under a 0700 folder), the three distributions and their
dependencies are copied once, root-owned and world-readable, to the temp folder (keyed by their
versions; about 170 MB here) and that copy is used. A start-up failure
(e.g. a version mismatch) is an observation naming the interpreter, the error and the fix.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
import io
import json
import logging
import os
import selectors
import shutil
import signal
import stat
import struct
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from PIL import Image

from rlstack.rewards.sandbox import SandboxLimits, SandboxProcess, is_disk_full
from rlstack.tools.base import (
    MAX_PIXELS,
    MIN_PIXELS,
    Observation,
    ToolCall,
    ToolError,
    check_pixel_limits,
    failed,
    fit_image,
    loaded,
)

logger = logging.getLogger(__name__)
_warned: set[str] = set()

_PACKAGES = {"PIL": "pillow", "numpy": "numpy", "matplotlib": "matplotlib"}
_HEADER = struct.Struct(">I")
_MAX_REPLY_BYTES = 256 << 20
_TRACEBACK_LINES = 12
_READ_CHUNK = 1 << 16
_MAX_CHUNKS_PER_READ = 64
_PNG_MODES = ("1", "L", "LA", "P", "RGB", "RGBA")


class PythonTool:
    """Run model-written Python on the input images, one sandboxed interpreter per trajectory."""

    name: ClassVar[str] = "python"
    schema: ClassVar[dict[str, Any]] = {
        "type": "function",
        "function": {
            "name": "python",
            "description": (
                "Run Python code in a notebook-like interpreter. Variables and imports persist across "
                "calls. The input images are preloaded as PIL images image_1, image_2, ... and saved as "
                "image_1.png, image_2.png, ... in the working directory. Pillow, NumPy and Matplotlib are "
                "available. You get back what the code prints and, as images, figures shown with "
                "plt.show(), images shown with img.show(), and a final expression that is an image. "
                "There is a time limit per call and no network access."
            ),
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "The Python code to run."}},
                "required": ["code"],
            },
        },
    }

    def __init__(
        self,
        timeout_s: float = 30.0,
        cpu_s: float = 300.0,
        memory_mb: int = 2048,
        file_size_mb: int = 64,
        disk_mb: int = 128,
        max_processes: int = 16,
        max_output_chars: int = 4096,
        max_images_per_call: int = 4,
        min_pixels: int = MIN_PIXELS,
        max_pixels: int = MAX_PIXELS,
        startup_timeout_s: float = 60.0,
    ) -> None:
        """Limits: `timeout_s` wall clock per call; `cpu_s` CPU seconds over one interpreter's life;
        `startup_timeout_s` for an interpreter to start (importing Pillow, loading the images);
        `disk_mb` for all its files at once (working directory, input images, /tmp, /dev/shm)."""
        positive = dict(timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, file_size_mb=file_size_mb)
        positive |= dict(disk_mb=disk_mb, max_processes=max_processes, max_output_chars=max_output_chars)
        positive |= dict(max_images_per_call=max_images_per_call, startup_timeout_s=startup_timeout_s)
        for key, value in positive.items():
            if not value > 0:
                raise ToolError(f"builtin:python: {key}={value!r} must be positive")
        check_pixel_limits("builtin:python", min_pixels, max_pixels)
        self.timeout_s, self.startup_timeout_s = timeout_s, startup_timeout_s
        self.max_output_chars, self.max_images_per_call = max_output_chars, max_images_per_call
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        self.limits = SandboxLimits(
            wall_s=timeout_s,
            cpu_s=cpu_s,
            memory_mb=memory_mb,
            file_size_mb=file_size_mb,
            max_processes=max_processes,
            disk_mb=disk_mb,
        )
        self.package_dirs = _package_dirs()
        self._images: list[Image.Image] = []
        self._files: dict[str, bytes] | None = None
        self._interpreter: _Interpreter | None = None
        self._calls = 0

    def reset(self, images: list[Image.Image], extra: dict[str, Any]) -> None:
        self.close()
        self._images = loaded(images)
        self._files = None  # encoded again for the new images on the next start

    def execute(self, call: ToolCall) -> Observation:
        code = call.arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return failed(f"the python tool needs a non-empty string argument 'code', got {code!r}")
        if self._interpreter is None:
            started = self._start()
            if isinstance(started, Observation):
                return started
            self._interpreter = started
        self._calls += 1
        request = {"id": self._calls, "code": code}
        reply, output = self._interpreter.exchange(request, self.timeout_s, self.max_output_chars)
        if isinstance(reply, _Lost):
            self.close()
            return self._lost(reply, output)
        self._interpreter.process.kill_strays()
        return self._observation(reply, output)

    def close(self) -> None:
        """Stop the interpreter and remove its files (also between trajectories, via `reset`)."""
        if self._interpreter is not None:
            self._interpreter.close()
            self._interpreter = None

    def _start(self) -> _Interpreter | Observation:
        if self._files is None:
            self._files = {f"image_{i}.png": _png(img) for i, img in enumerate(self._images, 1)}
        init = {
            "paths": list(self.package_dirs),
            "images": list(self._files),
            "max_pixels": self.max_pixels,
            "max_images": self.max_images_per_call,
            "max_value_chars": self.max_output_chars,
        }
        try:
            process = SandboxProcess(_worker_source(), self._files, self.limits, self.package_dirs)
            interpreter = _Interpreter(process)
        except (OSError, ValueError) as e:
            return failed(f"the Python interpreter could not start: {e}")
        reply, output = interpreter.exchange(init, self.startup_timeout_s, self.max_output_chars)
        if isinstance(reply, _Lost) or not reply.get("ready"):
            interpreter.close()
            return failed(self._startup_error(reply, output))
        return interpreter

    def _startup_error(self, reply: dict | _Lost, output: str) -> str:
        """Why no interpreter could start; also logged once, since it is the environment's fault, not the model's."""
        if isinstance(reply, _Lost):
            why = "it did not start in time" if reply.timed_out else reply.why
            message = f"the Python interpreter could not start: {why}; its output: {output[-1000:]!r}"
        else:
            error = str(reply.get("error"))
            message = (
                f"the sandbox's Python ({reply.get('python')}) could not set up the interpreter: {error}"
            )
            if error.startswith(("ImportError", "ModuleNotFoundError")):
                message += (
                    f". It imports Pillow, NumPy and Matplotlib from the trainer's environment "
                    f"{list(self.package_dirs)}; compiled packages need the trainer's Python minor version "
                    f"({sys.version.split()[0]}). Fix: make the trainer's interpreter executable for every "
                    "user (the sandbox then uses it), or install pillow, numpy and matplotlib for that Python"
                )
        if message not in _warned:
            _warned.add(message)
            logger.warning("builtin:python: %s", message)
        return message

    def _lost(self, lost: _Lost, output: str) -> Observation:
        if lost.timed_out:
            error = f"the code did not finish within the {self.timeout_s:g} s time limit and was stopped"
        else:
            error = f"the interpreter {lost.why}"
        restart = "the next call starts a fresh interpreter"
        if self._images:
            names = ", ".join(f"image_{i}" for i in range(1, len(self._images) + 1))
            restart += f" with the input images loaded again ({names})"
        text = (
            f"{output.rstrip()}\nError: {error}. All state was lost (variables, imports, files); {restart}."
        )
        return failed(f"{error}; interpreter state lost", text.lstrip("\n"))

    def _observation(self, reply: dict, output: str) -> Observation:
        parts = [output.rstrip("\n")] if output.strip() else []
        if reply["value"] is not None:
            parts.append(reply["value"])
        images, notes = [], list(reply["notes"])
        if not reply["ok"]:
            parts.append("\n".join(reply["traceback"].rstrip("\n").splitlines()[-_TRACEBACK_LINES:]))
            if is_disk_full(reply["error"]):
                notes.append(
                    f"disk budget of {self.limits.disk_mb} MiB exceeded: the working directory, /tmp and "
                    "/dev/shm share it; delete files to free space"
                )
        for encoded in reply["images"]:
            image = self._decode(encoded)
            if isinstance(image, str):
                notes.append(image)
            else:
                images.append(image)
        if reply["dropped_images"]:
            notes.append(
                f"only the first {self.max_images_per_call} images are returned; "
                f"{reply['dropped_images']} more were not (at most {self.max_images_per_call} per call)"
            )
        parts += [f"[{note}]" for note in notes]
        text = "\n".join(parts) or ("" if images else "(no output)")
        error = reply["error"] and _valid_unicode(reply["error"])
        return Observation(text=_valid_unicode(text), images=images, ok=reply["ok"], error=error)

    def _decode(self, encoded: str) -> Image.Image | str:
        """An image of the reply, fitted to the pixel limits, or why it was rejected (it is untrusted)."""
        try:
            image = Image.open(io.BytesIO(base64.b64decode(encoded, validate=True)))
            width, height = image.size
            if image.format != "PNG" or not 0 < width * height <= self.max_pixels:
                return f"an image was rejected: {image.format} of {width}x{height} pixels"
            image.load()
            return fit_image(image, self.min_pixels, self.max_pixels)
        except (OSError, ValueError, Image.DecompressionBombError) as e:
            return f"an image could not be decoded: {type(e).__name__}"


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


def _valid_unicode(text: str) -> str:
    """`text` without lone surrogates (JSON lets the worker send them; tokenizers reject them)."""
    return text.encode("utf-8", "replace").decode("utf-8")


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


@functools.cache
def _worker_source() -> str:
    return Path(__file__).with_name("python_worker.py").read_text()


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    (image if image.mode in _PNG_MODES else image.convert("RGB")).save(buf, format="PNG")
    return buf.getvalue()


@functools.cache
def _package_dirs() -> tuple[str, ...]:
    """Directories to put on the sandbox's `sys.path` so that Pillow, NumPy and Matplotlib import there.

    Normally the trainer's own site-packages. When the sandbox uid cannot read them (a virtual
    environment under a 0700 directory, e.g. a checkout in `mktemp -d`), a world-readable copy of
    those three distributions and their dependencies (`_readable_copy`) is used instead.
    """
    dirs: list[str] = []
    blocked = []
    for module, package in _PACKAGES.items():
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise ToolError(
                f"builtin:python needs {package} in the trainer's environment: pip install {package}"
            )
        package_dir = list(spec.submodule_search_locations)[0]
        if os.geteuid() == 0:  # the sandbox runs as another uid (rewards/sandbox.py)
            reason = _not_world_readable(package_dir)
            if reason is not None:
                blocked.append(reason)
        site_dir = os.path.dirname(package_dir)
        if site_dir not in dirs:
            dirs.append(site_dir)
    if blocked:
        return (_readable_copy(tuple(_PACKAGES.values()), blocked[0]),)
    for path in sys.path:
        if path.endswith(("site-packages", "dist-packages")) and path not in dirs:
            dirs.append(path)
    return tuple(dirs)


def _readable_copy(packages: tuple[str, ...], why: str) -> str:
    """A root-owned, world-readable copy of `packages` and their dependencies (their installed files,
    from `importlib.metadata`), made once per machine and set of versions under the temp folder."""
    from importlib import metadata

    from packaging.requirements import Requirement

    dists: dict[str, metadata.Distribution] = {}
    todo = list(packages)
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in dists:
            continue
        try:
            dist = dists[name] = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional dependency that is not installed
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    key = hashlib.sha1(
        repr(sorted((n, d.version, str(d.locate_file(""))) for n, d in dists.items())).encode()
    ).hexdigest()[:12]
    target = Path(tempfile.gettempdir()) / f"rlstack-sandbox-packages-{key}"
    if _trusted(target):
        return str(target)
    logger.warning("builtin:python: %s; copying %s for the sandbox to %s", why, sorted(dists), target)
    staging = Path(tempfile.mkdtemp(prefix="rlstack-sandbox-packages-", dir=target.parent))
    for dist in dists.values():
        for file in dist.files or []:
            source = Path(dist.locate_file(file))
            if ".." in file.parts or not source.is_file():
                continue  # scripts installed outside site-packages, files removed since
            destination = staging / file
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination)
    for root, _, files in os.walk(staging):
        os.chmod(root, 0o755)
        for name in files:
            path = os.path.join(root, name)
            os.chmod(path, 0o755 if os.stat(path).st_mode & stat.S_IXUSR else 0o644)
    try:
        staging.rename(target)
    except OSError:  # another process made it first
        shutil.rmtree(staging, ignore_errors=True)
    if not _trusted(target):
        raise ToolError(
            f"builtin:python: {why}, and no trusted readable copy could be made at {target}. Fix: put the "
            "trainer's environment where every user can read it (e.g. a venv under /opt), or run chmod o+rx "
            "on that directory"
        )
    return str(target)


def _trusted(path: Path) -> bool:
    """A directory owned by root that nobody else can write to (so sandboxed code cannot plant modules)."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return False
    return (
        stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _not_world_readable(path: str) -> str | None:
    """Which directory on `path` keeps other users out, or None when they can list and read it all."""
    parts = os.path.realpath(path).split(os.sep)
    for i in range(2, len(parts) + 1):
        directory = os.sep.join(parts[:i])
        mode = os.stat(directory).st_mode
        if not mode & stat.S_IXOTH:
            return f"{directory} is not searchable by other users (mode {stat.filemode(mode)})"
    mode = os.stat(path).st_mode
    if not mode & stat.S_IROTH:
        return f"{path} is not readable by other users (mode {stat.filemode(mode)})"
    return None
