"""`builtin:visual`: read a tiny digit in a cluttered picture, a task where zooming in helps.

Each row is one 224x224 RGB picture (64 visual tokens for Qwen2.5-VL: one per 28x28 pixels)
full of coloured shapes and stray letters, with ONE small white box holding a digit 0-9 drawn
in PIL's bitmap font. The box is 12x13 pixels and the digit's ink 5-6x7, about a twentieth of
one visual token's area. At the native size every pixel is there and the digit is only small;
under a pixel budget below it, its 1-2 pixel strokes blur together, while a crop around the box
(an image zoom tool, or `image_1.crop(...)` in the Python tool) resized to the same budget shows
it at full contrast. `tests/e2e/test_visual_task.py` measures this as the share of the 45 pairs of
digits whose views differ clearly (>= 64 grey levels in >= 3 pixels): whole picture vs a 32x32
crop, both resized to 56x56: 0% vs 100%; to 112x112: 50% vs 100%; at 224x224 the whole picture
also tells all pairs apart.

The question carries the `<image>` placeholder; the answer is the digit as a string. Rows
hold decoded pictures: the train split is about 300 MB and takes about a second to draw.

A row is a function of (split, index) alone: its random generator is seeded with
`"visual:<split>:<index>"`, so rows are the same in every process and on every machine. The
target, (digit, box position), is assigned to a split by a fixed hash (sha256 modulo 10, 0 =
`test`), so no test row repeats a train row's target; the clutter differs anyway.

`extra["target_bbox"]` is the box as `[x0, y0, x1, y1]` in pixels, right and bottom exclusive
(`image.crop(target_bbox)` is exactly the box), for reward functions and tool tests.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from PIL import Image, ImageDraw, ImageFont

from rlstack.data.images import fit_pixels

SIZE = 224
"""Width and height of every picture."""
ROWS = {"train": 2000, "test": 200}
QUESTION = (
    "<image>What digit is written in the small white box? "
    "Answer with a single digit inside <answer></answer>."
)

FONT = ImageFont.load_default_imagefont()  # the bitmap font: the same glyphs with or without FreeType
GLYPH_W, GLYPH_H = 6, 11  # every character cell of FONT; the digits' ink sits in rows 2-8
BOX_W, BOX_H = GLYPH_W + 6, 13  # 2 px of white and a 1 px black border around the ink
_MARGIN = 4  # the box keeps this far from the picture's edge
_LETTERS = "ACEFHKMNPRUVWXY"  # distractor text: letters that do not look like digits


@dataclass(frozen=True)
class Scene:
    """Everything a picture shows, so that it can be redrawn with a part changed."""

    background: tuple[int, int, int]
    clutter: tuple[tuple, ...]
    """Drawing operations `(kind, xy, colour)`: kind `rect`, `ellipse`, `line`, `polygon` or a letter."""
    digit: int
    box: tuple[int, int]
    """Top-left corner of the target box."""

    @property
    def target_bbox(self) -> list[int]:
        x, y = self.box
        return [x, y, x + BOX_W, y + BOX_H]


def held_out(digit: int, box: tuple[int, int]) -> bool:
    """Whether a target belongs to the `test` split (about one in ten)."""
    return int(hashlib.sha256(f"{digit}@{box[0]},{box[1]}".encode()).hexdigest(), 16) % 10 == 0


def sample_scene(split: str, index: int) -> Scene:
    """Row `index` of `split`, as a scene (deterministic)."""
    rng = random.Random(f"visual:{split}:{index}")
    while True:  # rejection: about 1.1 draws for train, 10 for test
        digit = rng.randrange(10)
        box = (rng.randrange(_MARGIN, SIZE - _MARGIN - BOX_W), rng.randrange(_MARGIN, SIZE - _MARGIN - BOX_H))
        if held_out(digit, box) == (split == "test"):
            break
    background = tuple(rng.randrange(150, 236) for _ in range(3))
    clutter = []
    for _ in range(rng.randrange(25, 41)):
        kind = rng.choice(("rect", "ellipse", "line", "polygon"))
        colour = tuple(rng.randrange(0, 200) for _ in range(3))  # never white, unlike the target box
        x, y, s = rng.randrange(SIZE), rng.randrange(SIZE), rng.randrange(6, 40)
        if kind in ("rect", "ellipse"):
            xy = (x, y, x + s, y + rng.randrange(6, 40))
        elif kind == "line":
            xy = (x, y, x + rng.randrange(-s, s + 1), y + rng.randrange(-s, s + 1))
        else:
            xy = tuple((x + rng.randrange(-s, s + 1), y + rng.randrange(-s, s + 1)) for _ in range(3))
        clutter.append((kind, xy, colour))
    for _ in range(rng.randrange(4, 9)):
        colour = tuple(rng.randrange(0, 120) for _ in range(3))
        clutter.append(
            (rng.choice(_LETTERS), (rng.randrange(SIZE - GLYPH_W), rng.randrange(SIZE - GLYPH_H)), colour)
        )
    return Scene(background, tuple(clutter), digit, box)


def draw(scene: Scene) -> Image.Image:
    """The scene as a SIZE x SIZE RGB picture: clutter first, the target box on top."""
    image = Image.new("RGB", (SIZE, SIZE), scene.background)
    pen = ImageDraw.Draw(image)
    for kind, xy, colour in scene.clutter:
        if kind == "rect":
            pen.rectangle(xy, fill=colour)
        elif kind == "ellipse":
            pen.ellipse(xy, fill=colour)
        elif kind == "line":
            pen.line(xy, fill=colour, width=2)
        elif kind == "polygon":
            pen.polygon(xy, fill=colour)
        else:
            pen.text(xy, kind, font=FONT, fill=colour)
    x0, y0, x1, y1 = scene.target_bbox
    pen.rectangle((x0, y0, x1 - 1, y1 - 1), fill=(255, 255, 255), outline=(0, 0, 0))
    pen.text((x0 + 3, y0 + 1), str(scene.digit), font=FONT, fill=(0, 0, 0))  # ink rows y0+3..y0+9
    return image


def row(split: str, index: int) -> dict:
    """Row `index` of `split` in rlstack's canonical form."""
    scene = sample_scene(split, index)
    return {
        "problem": QUESTION,
        "answer": str(scene.digit),
        "data_source": "visual",
        "images": [draw(scene)],
        "extra": {"target_bbox": scene.target_bbox},
    }


def rows(split: str) -> list[dict]:
    """All rows of `split` (`train`: 2,000, `test`: 200)."""
    return [row(split, i) for i in range(ROWS[split])]


TILE, TILE_STEP = 128, 96
"""The warm start crops one of four overlapping 128x128 tiles (offsets 0 and 96 per axis); every box
lies wholly inside at least one, so the policy only has to find the box's quadrant."""
TOOL_MIN_PIXELS, TOOL_MAX_PIXELS = 4 * 28 * 28, 1024 * 28 * 28
"""The Python tool's default limits on returned images (`tools.base.MIN_PIXELS` / `MAX_PIXELS`)."""


def crop_box(bbox: tuple[int, int, int, int] | list[int]) -> tuple[int, int, int, int]:
    """The tile that holds the target box (the one whose centre is nearest the box's)."""
    x0, y0, x1, y1 = bbox

    def offset(lo: int, hi: int) -> int:
        fits = [o for o in (0, TILE_STEP) if o <= lo and hi <= o + TILE]
        return min(fits, key=lambda o: abs(o + TILE / 2 - (lo + hi) / 2))

    left, top = offset(x0, x1), offset(y0, y1)
    return (left, top, left + TILE, top + TILE)


def crop_call(bbox: tuple[int, int, int, int] | list[int]) -> str:
    """The first agent turn of the warm start: a Python cell that crops around the box (the last
    expression, an image, comes back to the model), in the `code` tool-call format."""
    return f"<code>```python\nimage_1.crop({crop_box(bbox)})\n```</code>"


def tool_sft_rows(split: str) -> list[dict]:
    """`builtin:visual_tool_sft`: the `visual` rows with a whole tool-using trajectory as the answer,
    the supervised warm start of `rlstack demo --task visual`: the crop call, the Python tool's
    observation (no text, the crop enlarged as the tool returns it), then `<answer>digit</answer>`.
    Coordinates are pixels of the original picture, which is what the tool works on."""
    out = []
    for r in rows(split):
        bbox = r["extra"]["target_bbox"]
        crop = fit_pixels(r["images"][0].crop(crop_box(bbox)), TOOL_MIN_PIXELS, TOOL_MAX_PIXELS, 28)
        conversation = [
            {"role": "assistant", "content": crop_call(bbox)},
            {"role": "user", "content": "<image>", "images": [crop]},
            {"role": "assistant", "content": f"<answer>{r['answer']}</answer>"},
        ]
        out.append({**r, "answer": conversation, "data_source": "visual_tool_sft"})
    return out
