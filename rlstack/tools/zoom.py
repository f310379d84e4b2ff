"""`builtin:zoom`: crop a region of an input image and show it larger (DeepEyes' `image_zoom_in_tool`).

Arguments, as in DeepEyes: `bbox_2d` `[x1, y1, x2, y2]` in pixels of the input image as the tool
received it (top-left corner x1, y1; bottom-right x2, y2; the data pipeline should hand the tool the
images the model sees, or the model's coordinates will not match), an optional `label` naming what
is in the box, and our addition `image_index` (1 = the first input image, the default) for rows with
several images.

A box that sticks out of the image is clamped to it (the text says so); a box that is not four
finite numbers, has x2 <= x1 or y2 <= y1, or lies entirely outside the image fails with an
observation that says which. The crop is resized like every returned image (`fit_image`): small
crops are enlarged to at least `min_pixels` (that is the zoom), large ones shrunk to `max_pixels`.

It runs in the trainer's process: it only crops and resizes images the trainer already holds.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from PIL import Image

from rlstack.tools.base import (
    MAX_PIXELS,
    MIN_PIXELS,
    Observation,
    ToolCall,
    check_pixel_limits,
    failed,
    fit_image,
    loaded,
)

_ARGUMENTS = ("bbox_2d", "label", "image_index")


class ZoomTool:
    """Crop `bbox_2d` out of an input image and return it enlarged."""

    name: ClassVar[str] = "image_zoom_in_tool"
    schema: ClassVar[dict[str, Any]] = {
        "type": "function",
        "function": {
            "name": "image_zoom_in_tool",
            "description": (
                "Zoom in on a region of an image by cropping it to a bounding box; the crop is shown "
                "to you enlarged."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "bbox_2d": {
                        "type": "array",
                        "items": {"type": "number"},
                        "minItems": 4,
                        "maxItems": 4,
                        "description": (
                            "The region as [x1, y1, x2, y2] in pixels of the image: (x1, y1) is the "
                            "top-left corner, (x2, y2) the bottom-right corner."
                        ),
                    },
                    "label": {"type": "string", "description": "What is in the region (optional)."},
                    "image_index": {
                        "type": "integer",
                        "description": "Which input image to zoom into: 1 for the first (default), 2 for the second, ...",
                    },
                },
                "required": ["bbox_2d"],
            },
        },
    }

    def __init__(self, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS) -> None:
        check_pixel_limits("builtin:zoom", min_pixels, max_pixels)
        self.min_pixels = min_pixels
        self.max_pixels = max_pixels
        self._images: list[Image.Image] = []

    def reset(self, images: list[Image.Image], extra: dict[str, Any]) -> None:
        self._images = loaded(images)

    def execute(self, call: ToolCall) -> Observation:
        args = call.arguments
        unknown = sorted(set(args) - set(_ARGUMENTS))
        if unknown:
            return failed(f"unknown argument(s) {unknown}; the arguments are {list(_ARGUMENTS)}")
        label = args.get("label")
        if label is not None and not isinstance(label, str):
            return failed(f"label must be a string, got {label!r}")
        image = self._image(args.get("image_index", 1))
        if isinstance(image, Observation):
            return image
        box = _clamped_box(args.get("bbox_2d"), image.size)
        if isinstance(box, Observation):
            return box
        (x1, y1, x2, y2), clamped = box
        crop = fit_image(image.crop((x1, y1, x2, y2)), self.min_pixels, self.max_pixels)
        what = f" ({label})" if label else ""
        note = f"; the box was clamped to the {image.width}x{image.height} image" if clamped else ""
        text = f"Zoomed in on [{x1}, {y1}, {x2}, {y2}]{what}{note}: the {x2 - x1}x{y2 - y1} region, shown at {crop.width}x{crop.height}."
        return Observation(text=text, images=[crop])

    def close(self) -> None:
        self._images = []

    def _image(self, index: Any) -> Image.Image | Observation:
        if not self._images:
            return failed("this task has no input image to zoom into")
        if not isinstance(index, int) or isinstance(index, bool) or not 1 <= index <= len(self._images):
            return failed(f"image_index must be an integer from 1 to {len(self._images)}, got {index!r}")
        return self._images[index - 1]


def _clamped_box(bbox: Any, size: tuple[int, int]) -> tuple[tuple[int, int, int, int], bool] | Observation:
    """The integer box inside the image and whether it had to be clamped, or what is wrong with `bbox`."""
    if bbox is None:
        return failed("bbox_2d is required: [x1, y1, x2, y2] in pixels")
    numbers = isinstance(bbox, list | tuple) and all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in bbox
    )
    if not numbers or len(bbox) != 4:
        return failed(f"bbox_2d must be four numbers [x1, y1, x2, y2], got {bbox!r}")
    x1, y1, x2, y2 = bbox
    if x2 <= x1 or y2 <= y1:
        return failed(
            f"bbox_2d {list(bbox)} is empty: need x1 < x2 and y1 < y2 (top-left, then bottom-right)"
        )
    width, height = size
    box = (
        max(0, math.floor(x1)),
        max(0, math.floor(y1)),
        min(width, math.ceil(x2)),
        min(height, math.ceil(y2)),
    )
    if box[2] <= box[0] or box[3] <= box[1]:
        return failed(f"bbox_2d {list(bbox)} lies outside the {width}x{height} image")
    clamped = x1 < 0 or y1 < 0 or x2 > width or y2 > height
    return box, clamped
