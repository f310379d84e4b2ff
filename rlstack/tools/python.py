"""`builtin:python`: a notebook-like Python interpreter per trajectory, in the sandbox (CodeV / PyVision).

What the model gets (also in `PythonTool.schema`'s description):

- One interpreter per trajectory: variables, imports and files persist across its calls and are
  invisible to other trajectories.
- The input images are preloaded: as PIL images `image_1`, `image_2`, ... in the namespace and as
  files `image_1.png`, `image_2.png`, ... in the working directory, or under the names of the agent's
  tool contract (`tools/contract.py`: PyVision's `image_clue_0`, ...; CodeV's `image_filename` holds
  the first file's name).
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
  at all (`rewards/sandbox/`).

Cost: an interpreter starts on the first call of its trajectory (about 0.1 s: it imports only
Pillow; NumPy and Matplotlib, most of a second together, are imported by the cells that use them,
and `plt.show()` is hooked at that moment) and holds about 17 MB of memory (66 MB once a cell
imports Matplotlib) until `close()`; a batch of trajectories in flight holds one each.

Where the code runs: never in the trainer, and never in a fork of it. Each interpreter is
`tools/python_worker.py` in a `SandboxProcess` (`rewards/sandbox/`), started by a launcher
process of its own that passes back its pipes: own uid, own root with only the interpreter, its
libraries and the packages below (read-only) and its scratch space; own PID namespace and /proc,
own IPC namespace, no network; rlimits on address space (`memory_mb`), file size
(`file_size_mb`), processes (`max_processes`) and CPU; a scrubbed environment. Trainer and worker
exchange length-prefixed JSON frames over the worker's stdin/stdout (images as base64 PNG); the
worker moves that protocol off fds 0-2 before any user code runs, so printing cannot corrupt it,
and the trainer treats any reply it cannot parse as a crash (the trainer's end of the pipes is
`tools/python_channel.py`).

Pillow, NumPy and Matplotlib come from the trainer's own environment (`tools/python_packages.py`):
the worker appends the directories the trainer imports them from to `sys.path`. The sandbox's
interpreter is the trainer's when the sandbox uid can run it (every directory from its prefix down
world-searchable), else the system `python3`; their C extensions load when its minor version matches
the trainer's. The package directories are bound, read-only, into the interpreter's root at their
own paths. When the sandbox uid cannot read them (a venv under a 0700 folder), the three
distributions and their dependencies are copied once, root-owned and world-readable, to the temp
folder (keyed by their versions; about 170 MB here) and that copy is used. A start-up failure (e.g.
a version mismatch) is an observation naming the interpreter, the error and the fix.
"""

from __future__ import annotations

import base64
import functools
import io
import logging
import sys
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
from rlstack.tools.python_channel import _Interpreter, _Lost
from rlstack.tools.python_packages import _package_dirs

logger = logging.getLogger(__name__)
_warned: set[str] = set()

_TRACEBACK_LINES = 12
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
        contract: str = "rlstack",
    ) -> None:
        """Limits: `timeout_s` wall clock per call; `cpu_s` CPU seconds over one interpreter's life;
        `startup_timeout_s` for an interpreter to start (importing Pillow, loading the images);
        `disk_mb` for all its files at once (working directory, input images, /tmp, /dev/shm).
        `contract` (set from `worker.rollout.agent.tool_contract`) names the input images."""
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
            names = ", ".join(self.contract.image_name(i) for i in range(len(self._images)))
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
