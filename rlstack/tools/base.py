"""The tool protocol: what the agent loop hands a tool (`ToolCall`) and what it gets back (`Observation`).

A tool is any class with

- `name: str` (class attribute): what the model calls it (`<tool_call>{"name": ...}`),
- `schema: dict` (class attribute): its OpenAI function schema
  `{"type": "function", "function": {"name", "description", "parameters"}}`, rendered into the
  Hermes `<tools>` block of the system prompt (Qwen2.5 / veRL convention),
- `reset(images, extra)`: the start of a trajectory, with the row's input images and `extra` dict,
- `execute(call) -> Observation`: one call; failures (bad arguments, crash, timeout) are an
  `Observation` with `ok=False` that the model can read, not an exception,
- `close()`: the end of the trajectory; release processes and files.

An instance belongs to one trajectory (state never leaks between trajectories), and `execute` may
run in a worker thread while other trajectories' tools run in other threads, so a tool keeps its
state on the instance and shares nothing mutable between instances. Constructor keyword arguments
are the tool's limits, set from its spec's `kwargs` (`tools/registry.py`).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from PIL import Image

from rlstack.data.images import fit_pixels
from rlstack.errors import RLStackError
from rlstack.models.vision import ImageInputError

PATCH = 28
"""Qwen2.5-VL's effective patch (14-pixel patches merged 2x2): returned image sides are multiples of it."""
MIN_PIXELS = 4 * PATCH * PATCH
"""Default lower bound on a returned image's area."""
MAX_PIXELS = 1024 * PATCH * PATCH
"""Default upper bound on a returned image's area (about a megapixel)."""


class ToolError(RLStackError, ValueError):
    """A tool that cannot be built or run in this environment, with the fix."""


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the tool's name, its arguments, and the tagged text it came from."""

    name: str
    arguments: dict[str, Any]
    raw: str


@dataclass
class Observation:
    """What a call returns to the model: text, images, and whether the call worked."""

    text: str
    images: list[Image.Image] = field(default_factory=list)
    ok: bool = True
    """False when the call failed: bad arguments, the tool crashed, timed out or raised."""
    error: str | None = None
    """For failures, one line that says what went wrong (logged and counted by the agent loop)."""
    evaluated: bool = False
    """Code that ended with an expression, which ran without error (`worker.rollout.agent.end_on_evaluation`)."""


def failed(error: str, text: str | None = None) -> Observation:
    """A failed call: `text` for the model (default `Error: <error>`), `error` for the logs."""
    return Observation(text=text if text is not None else f"Error: {error}", ok=False, error=error)


class Tool(Protocol):
    """The shape of a tool (see module docstring); implement it, do not subclass it."""

    name: ClassVar[str]
    schema: ClassVar[dict[str, Any]]

    def reset(self, images: list[Image.Image], extra: dict[str, Any]) -> None: ...

    def execute(self, call: ToolCall) -> Observation: ...

    def close(self) -> None: ...


_LOAD_LOCK = threading.Lock()


def loaded(images: list[Image.Image]) -> list[Image.Image]:
    """A list of `images` with their pixels read, for `reset`.

    PIL reads an opened file's pixels lazily, which is not safe from two threads at once, and the
    n trajectories of a prompt share its images; once loaded, reading them concurrently is.
    """
    with _LOAD_LOCK:
        for image in images:
            image.load()
    return list(images)


def fit_image(image: Image.Image, min_pixels: int, max_pixels: int) -> Image.Image:
    """`image` in RGB, resized so its area is within [min_pixels, max_pixels] and both sides are multiples of 28.

    Qwen2.5-VL's `smart_resize` rule, the same as the dataset's (`data.images.fit_pixels`), so the
    model's image processor leaves the result as it is. Images too thin for `smart_resize` (aspect
    ratio over 200, e.g. a one-pixel-high plot) get 28 pixels across and are cut down along their
    long side to stay under `max_pixels`, instead of an error.
    """
    image = image.convert("RGB")
    try:
        return fit_pixels(image, min_pixels, max_pixels, PATCH)
    except ImageInputError:
        pass
    width, height = image.size
    w, h = _round_to_patch(width), _round_to_patch(height)
    if w * h > max_pixels:
        if w >= h:
            w = _floor_to_patch(max_pixels / h)
        else:
            h = _floor_to_patch(max_pixels / w)
    return image.resize((w, h), Image.Resampling.BICUBIC)


def _round_to_patch(x: float) -> int:
    return max(PATCH, round(x / PATCH) * PATCH)


def _floor_to_patch(x: float) -> int:
    return max(PATCH, math.floor(x / PATCH) * PATCH)


def check_pixel_limits(tool: str, min_pixels: int, max_pixels: int) -> None:
    """Raise `ToolError` unless 28*28 <= min_pixels <= max_pixels."""
    if not PATCH * PATCH <= min_pixels <= max_pixels:
        raise ToolError(
            f"{tool}: min_pixels={min_pixels}, max_pixels={max_pixels}; need {PATCH * PATCH} <= min_pixels "
            f"<= max_pixels (Qwen2.5-VL's defaults are {MIN_PIXELS} and {MAX_PIXELS})"
        )
