"""`builtin:visual` (a tiny digit in clutter) and the agent prompts in examples/agents/."""

from __future__ import annotations

import ast
import hashlib
import itertools
import json
import re
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rlstack.data import visual
from rlstack.data.dataset import PromptDataset, _load_template, _messages
from rlstack.data.readers import read_rows
from rlstack.data.tasks import builtin_rows

AGENTS = Path(__file__).resolve().parents[2] / "examples" / "agents"


@pytest.fixture(scope="module")
def train() -> list[dict]:
    return visual.rows("train")


@pytest.fixture(scope="module")
def test_rows() -> list[dict]:
    return visual.rows("test")


def _digest(image: Image.Image) -> str:
    return hashlib.sha256(image.tobytes()).hexdigest()


def test_rows_are_canonical_and_deterministic(test_rows):
    rows, where = read_rows("builtin:visual@test")
    assert len(rows) == 200 and where[0] == "builtin:visual@test[0]"
    assert len(builtin_rows("builtin:visual")) == 2000  # the default split is train
    r = rows[7]
    assert r["problem"].startswith("<image>") and "<answer></answer>" in r["problem"]
    assert r["answer"] in "0123456789" and len(r["answer"]) == 1 and r["data_source"] == "visual"
    (image,) = r["images"]
    assert image.mode == "RGB" and image.size == (visual.SIZE, visual.SIZE)
    again = visual.row("test", 7)
    assert _digest(again["images"][0]) == _digest(image) and again["extra"] == r["extra"]
    assert again["answer"] == r["answer"] == test_rows[7]["answer"]
    # the scene is a function of (split, index) alone: these values must not drift between versions
    assert [
        (visual.sample_scene(s, i).digit, visual.sample_scene(s, i).target_bbox)
        for s, i in (("train", 0), ("test", 0))
    ] == [
        (0, [176, 50, 188, 63]),
        (4, [30, 86, 42, 99]),
    ]


def test_generating_is_cheap():
    start = time.perf_counter()
    rows = visual.rows("test")
    assert len(rows) == 200 and time.perf_counter() - start < 2.0


def test_splits_are_disjoint(train, test_rows):
    assert len(train) == 2000 and len(test_rows) == 200

    def targets(rows):
        return {(r["answer"], tuple(r["extra"]["target_bbox"])) for r in rows}

    assert len(targets(test_rows)) == 200  # no target repeats inside the test split either
    assert not targets(train) & targets(test_rows)
    assert not {_digest(r["images"][0]) for r in train} & {_digest(r["images"][0]) for r in test_rows}
    assert all(visual.held_out(int(r["answer"]), tuple(r["extra"]["target_bbox"][:2])) for r in test_rows)
    assert {r["answer"] for r in test_rows} == set("0123456789")


def _ink(image: Image.Image, bbox: list[int]) -> np.ndarray:
    """Dark pixels inside the box's border."""
    return np.asarray(image.crop(bbox).convert("L"))[1:-1, 1:-1] < 128


def _glyph(digit: int) -> np.ndarray:
    """The font's own bitmap of `digit`, where `draw` puts it inside the box's border."""
    mask = visual.FONT.getmask(str(digit))
    bitmap = np.asarray(mask, dtype=np.uint8).reshape(mask.size[1], mask.size[0]) > 0
    out = np.zeros((visual.BOX_H - 2, visual.BOX_W - 2), dtype=bool)
    out[0 : bitmap.shape[0], 2 : 2 + bitmap.shape[1]] = bitmap
    return out


def test_the_answer_is_the_digit_drawn_in_the_only_white_box(test_rows):
    glyphs = [_glyph(d) for d in range(10)]
    assert all((a != b).any() for a, b in itertools.combinations(glyphs, 2))
    for i, r in enumerate(test_rows[:50]):
        image, bbox = r["images"][0], r["extra"]["target_bbox"]
        ink = _ink(image, bbox)
        assert [d for d in range(10) if (ink == glyphs[d]).all()] == [int(r["answer"])]
        # nothing drawn over the target: the box looks the same without any clutter
        bare = visual.draw(replace(visual.sample_scene("test", i), clutter=()))
        assert _digest(bare.crop(bbox)) == _digest(image.crop(bbox))
        # pure white appears only inside the box, so "the small white box" names one place
        white = (np.asarray(image) == 255).all(axis=-1)
        inside = np.zeros_like(white)
        inside[bbox[1] : bbox[3], bbox[0] : bbox[2]] = True
        assert white.any() and not (white & ~inside).any()


# ------------------------------------------------------------------------ the premise: zoom helps


def _view(image: Image.Image, box: tuple[int, int, int, int], side: int) -> np.ndarray:
    """What a model gets at a budget of side x side pixels: the region resized as the Qwen2-VL processor does."""
    region = image.crop(box).resize((side, side), Image.Resampling.BICUBIC)
    return np.asarray(region.convert("L"), dtype=np.int16)


def _zoom_box(bbox: list[int], side: int = 32) -> tuple[int, int, int, int]:
    """A side x side square around the target, inside the picture."""
    cx, cy = (bbox[0] + bbox[2]) // 2, (bbox[1] + bbox[3]) // 2
    x0 = min(max(cx - side // 2, 0), visual.SIZE - side)
    y0 = min(max(cy - side // 2, 0), visual.SIZE - side)
    return x0, y0, x0 + side, y0 + side


def told_apart(views: list[np.ndarray], contrast: int = 64, pixels: int = 3) -> float:
    """Fraction of the 45 digit pairs whose views differ by >= `contrast` grey levels in >= `pixels` pixels."""
    pairs = list(itertools.combinations(views, 2))
    return sum(int((np.abs(a - b) >= contrast).sum() >= pixels) for a, b in pairs) / len(pairs)


def legibility(side: int, scenes: int = 20) -> tuple[float, float]:
    """Mean fraction of digit pairs told apart at a budget of side x side pixels: (whole picture, zoomed crop).

    Each scene is redrawn with each of the ten digits and nothing else changed, so any
    difference between two views is the digit's own signal.
    """
    whole, zoomed = [], []
    for i in range(scenes):
        scene = visual.sample_scene("test", i)
        images = [visual.draw(replace(scene, digit=d)) for d in range(10)]
        whole.append(told_apart([_view(im, (0, 0, visual.SIZE, visual.SIZE), side) for im in images]))
        zoomed.append(told_apart([_view(im, _zoom_box(scene.target_bbox), side) for im in images]))
    return float(np.mean(whole)), float(np.mean(zoomed))


def test_zooming_in_makes_the_digit_legible():
    # 56x56 (4 Qwen2.5-VL tokens): the whole picture hides the digit, a 32x32 crop shows it
    whole, zoomed = legibility(56)
    assert whole <= 0.05 and zoomed == 1.0
    # 112x112 (16 tokens): half the pairs of digits already blur into each other
    whole, zoomed = legibility(112)
    assert whole <= 0.6 and zoomed == 1.0
    # at the native 224x224 (64 tokens) every pixel survives; there the digit is small, not lost
    whole, _ = legibility(224, scenes=3)
    assert whole == 1.0


# ---------------------------------------------------------------------------------------- prompts


@pytest.mark.parametrize(
    ("name", "syntax"), [("code_format.jinja", "<code>```python"), ("zoom_format.jinja", "<tool_call>")]
)
def test_prompt_formats_render_the_question_with_the_tool_syntax(test_rows, name, syntax):
    row = test_rows[0]
    (message,) = _messages(
        row["problem"], row, _load_template(str(AGENTS / name)), "row", name, row["images"]
    )
    text = message["content"]
    assert text.startswith(visual.QUESTION) and text.count("<image>") == 1
    assert syntax in text and "<think></think>" in text and text.rstrip().endswith("<answer></answer>.")


def test_prompt_format_in_a_dataset(tok):
    ds = PromptDataset(
        "builtin:visual@test",
        tok,
        format_prompt=str(AGENTS / "zoom_format.jinja"),
        apply_chat_template=False,
        max_prompt_length=10_000,
        max_samples=3,
    )
    item = ds.items[0]
    assert "image_zoom_in_tool" in item["prompt"] and len(item["images"]) == 1
    assert item["ground_truth"] == visual.row("test", 0)["answer"]
    assert item["extra"]["target_bbox"] == visual.row("test", 0)["extra"]["target_bbox"]


@pytest.mark.parametrize(
    ("name", "image"), [("codev_system.txt", "image_filename"), ("pyvision_system.txt", "image_clue_0")]
)
def test_code_system_prompts(name, image):
    """The names and tags of each prompt's tool contract: tests/unit/test_tool_contracts.py."""
    text = (AGENTS / name).read_text()
    for needle in (
        "<think>",
        "<code>```python",
        "```</code>",
        image,
        "plt.show()",
        "Image.show()",
        "<answer></answer>",
    ):
        assert needle in text, needle
    for program in re.findall(r"<code>```python\n(.*?)```</code>", text, re.DOTALL):
        ast.parse(program)  # the worked example is valid Python


def test_zoom_system_prompt_declares_and_shows_the_tool():
    text = (AGENTS / "zoom_hermes_system.txt").read_text()
    (tools,) = re.findall(r"<tools>\n(.*?)\n</tools>", text, re.DOTALL)
    fn = json.loads(tools)["function"]
    assert fn["name"] == "image_zoom_in_tool" and fn["parameters"]["required"] == ["bbox_2d"]
    assert set(fn["parameters"]["properties"]) == {"bbox_2d", "label"}
    (call,) = re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, re.DOTALL)
    call = json.loads(call)
    assert call["name"] == fn["name"] and len(call["arguments"]["bbox_2d"]) == 4
    assert "<think></think>" in text and "<answer></answer>" in text


def test_readme_names_every_prompt_file():
    readme = (AGENTS / "README.md").read_text()
    files = sorted(p.name for p in AGENTS.iterdir() if p.name != "README.md")
    assert len(files) == 7 and all(f"`{f}`" in readme for f in files)
