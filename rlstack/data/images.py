"""Images of data rows: every stored form to an RGB PIL image, and resizing to a pixel budget.

A row's image may be a file path (relative ones are read from `image_dir`), raw bytes, a base64
string, a data URL (`data:image/png;base64,...`), a PIL image, a numpy `[H, W, C]` uint8 array,
or a parquet / Hugging Face `Image` struct `{"bytes": ..., "path": ...}`. Images are never
downloaded: an `http(s)://` address is an error that says so.
"""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from rlstack.models.vision import ImageInputError

FORMS = (
    "a file path, raw bytes, a base64 string, a data URL (data:image/png;base64,...), a PIL image, "
    'a [H, W, C] uint8 array, or a {"bytes": ..., "path": ...} struct'
)


def load_image(value: Any, where: str, image_dir: str | Path | None = None) -> Image.Image:
    """The RGB PIL image stored in `value`; `where` (e.g. "train.jsonl:12 images[0]") names it in errors."""
    if isinstance(value, Image.Image):
        return _rgb(value, where)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _decode(bytes(value), where, "the bytes")
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            return load_image(value["bytes"], where, image_dir)
        if value.get("path"):
            return load_image(str(value["path"]), where, image_dir)
        raise ImageInputError(
            f"{where}: the image struct has neither 'bytes' nor 'path' (keys: {sorted(value)}); "
            f"give each image as {FORMS}."
        )
    if hasattr(value, "__array_interface__"):  # numpy arrays
        try:
            return _rgb(Image.fromarray(value), where)
        except (TypeError, ValueError) as e:
            raise ImageInputError(
                f"{where}: the array is not an image ({e}); arrays must be [H, W], [H, W, 3] or [H, W, 4] uint8."
            ) from e
    if isinstance(value, str):
        return _from_string(value.strip(), where, image_dir)
    raise ImageInputError(
        f"{where}: a value of type {type(value).__name__} is not an image; give each image as {FORMS}."
    )


def fit_pixels(
    image: Image.Image, min_pixels: int, max_pixels: int, factor: int = 28, where: str = "the image"
) -> Image.Image:
    """`image` resized so both sides are multiples of `factor` and its area lies in [min_pixels, max_pixels],
    keeping the aspect ratio as Qwen2-VL's `smart_resize` does (`factor` = patch size x spatial merge size).
    """
    width, height = image.size
    try:
        new_height, new_width = smart_resize(
            height, width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels
        )
    except ValueError as e:  # an aspect ratio over 200
        raise ImageInputError(
            f"{where} ({width}x{height} pixels) cannot be resized for the model: {e}."
        ) from e
    if (new_width, new_height) == (width, height):
        return image
    return image.resize((new_width, new_height), Image.Resampling.BICUBIC)


def _from_string(value: str, where: str, image_dir: str | Path | None) -> Image.Image:
    if value.startswith("data:"):
        header, sep, payload = value.partition(",")
        if not sep or ";base64" not in header:
            raise ImageInputError(
                f"{where}: the data URL {value[:40]!r}... is not base64 encoded; "
                "write it as data:image/png;base64,<base64 of the file>."
            )
        return _decode(_b64(payload, where), where, "the data URL")
    if value.startswith(("http://", "https://")):
        raise ImageInputError(
            f"{where}: {value[:80]!r} is a web address; rlstack never downloads images. "
            "Download it and put the file path (or the image bytes) in the row instead."
        )
    path = Path(value)
    if image_dir is not None and not path.is_absolute():
        path = Path(image_dir) / path
    if _is_file(path):
        try:
            return _decode(path.read_bytes(), where, f"the file {str(path)!r}")
        except OSError as e:
            raise ImageInputError(f"{where}: cannot read the image file {str(path)!r}: {e}") from e
    try:
        data = _b64(value, where)
    except ImageInputError:
        raise ImageInputError(
            f"{where}: {value[:80]!r} is neither an existing image file nor base64 image data. "
            + (f"Relative paths are read from {str(image_dir)!r}; " if image_dir is not None else "")
            + f"give each image as {FORMS}."
        ) from None
    return _decode(data, where, "the base64 string")


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # e.g. a long base64 string is not a valid file name
        return False


def _b64(text: str, where: str) -> bytes:
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageInputError(f"{where}: invalid base64 image data ({e}).") from e


def _decode(data: bytes, where: str, what: str) -> Image.Image:
    try:
        image = Image.open(io.BytesIO(data))
        image.load()  # decode now, so a truncated or corrupt file fails here and not in the processor
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise ImageInputError(
            f"{where}: {what} ({len(data)} bytes) is not a readable image: {e}. "
            "Check that the row holds the whole image file (PNG, JPEG, ...) and re-export the data if not."
        ) from e
    return _rgb(image, where)


def _rgb(image: Image.Image, where: str) -> Image.Image:
    width, height = image.size
    if width < 1 or height < 1:
        raise ImageInputError(f"{where}: the image is empty ({width}x{height} pixels).")
    return image.convert("RGB")  # a new image in every case, so the caller's object is never changed
