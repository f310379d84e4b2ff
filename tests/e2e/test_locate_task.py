"""`builtin:locate`: the generator is pinned, a target colour's pixels are exactly its square, the
one-line program run in the sandboxed Python tool prints exactly what the warm start trains on, and
the weak teacher's mix is what the visual demo needs (see `rlstack/data/locate.py`)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from rlstack.data import locate
from rlstack.tools.base import ToolCall
from rlstack.tools.python import PythonTool


def _digest(rows: list[dict]) -> str:
    """Hash of rows, pictures included (as their raw pixels)."""
    h = hashlib.sha256()
    for r in rows:
        h.update(json.dumps({k: v for k, v in r.items() if k != "images"}, sort_keys=True).encode())
        for image in r.get("images", []):
            h.update(image.tobytes())
    return h.hexdigest()[:16]


def test_generator_is_pinned():
    """Same pictures, questions and teacher trajectories on every machine and in every process."""
    train, test = locate.rows("train"), locate.rows("test")
    assert (len(train), len(test)) == (1000, 240)
    assert (_digest(train[:100]), _digest(test)) == ("7bfeff6718d4e1a2", "9d62566a12b49e44")
    assert _digest(locate.tool_sft_rows("train")[:100]) == "98009ea74cba436c"
    assert {k: v for k, v in test[0].items() if k != "images"} == {
        "problem": "<image>Where is the red square? "
        "Answer top left, top right, bottom left or bottom right inside <answer></answer>.",
        "answer": "top right",
        "data_source": "locate",
        "extra": {
            "colour": "red",
            "quadrants": {
                "red": "top right",
                "green": "bottom right",
                "blue": "top left",
                "yellow": "top left",
                "purple": "top left",
            },
        },
    }
    # Every colour is asked about and every quadrant is an answer, in both splits.
    for rows in (train, test):
        assert {r["extra"]["colour"] for r in rows} == set(locate.COLOURS)
        assert {r["answer"] for r in rows} == set(locate.QUADRANTS)


def test_a_target_colour_is_exactly_its_square():
    """Nothing but the square has a target colour, so the program's first match is the square."""
    for split in ("train", "test"):
        for index in range(40):
            scene = locate.sample_scene(split, index)
            pixels = np.asarray(locate.draw(scene))
            for name, rgb in locate.COLOURS.items():
                ys, xs = np.nonzero((pixels == rgb).all(-1))
                x, y = scene.squares[name]
                assert len(ys) == locate.SQUARE**2, (split, index, name)
                assert (xs.min(), ys.min(), xs.max(), ys.max()) == (x, y, x + 5, y + 5)


def test_the_program_prints_what_the_warm_start_reads():
    """In the sandboxed Python tool, the program for each colour prints its square's quadrant, which
    is the observation and the answer of the teacher's trajectories."""
    rows, sft = locate.rows("test")[:6], locate.tool_sft_rows("test")[:6]
    tool = PythonTool()
    try:
        for r, s in zip(rows, sft, strict=True):
            tool.reset(r["images"], r["extra"])
            for name in locate.COLOURS:
                obs = tool.execute(ToolCall("python", {"code": locate.program(name)}, ""))
                assert (obs.ok, obs.text) == (True, r["extra"]["quadrants"][name])
            call, observation, answer = s["answer"]
            assert observation == {
                "role": "user",
                "content": answer["content"][len("<answer>") : -len("</answer>")],
            }
            guess = next(c for c in locate.COLOURS if call["content"] == locate.tool_call(c))
            assert observation["content"] == r["extra"]["quadrants"][guess]
    finally:
        tool.close()


def test_the_weak_teacher_looks_for_the_asked_colour_about_40_percent_of_the_time():
    rows = locate.rows("train")
    guesses = [locate.teacher_colour("train", i, r["extra"]["colour"]) for i, r in enumerate(rows)]
    assert all(
        g in (r["extra"]["colour"], locate.DECOYS[r["extra"]["colour"]]) for g, r in zip(guesses, rows)
    )
    right = [g == r["extra"]["colour"] for g, r in zip(guesses, rows)]
    assert 0.35 < sum(right) / len(rows) < 0.45
    # Every colour gets both programs from the teacher, and the decoys form one cycle (no two swap).
    for name in locate.COLOURS:
        assert {ok for ok, r in zip(right, rows) if r["extra"]["colour"] == name} == {True, False}
    colour, cycle = "red", []
    while colour not in cycle:
        cycle.append(colour)
        colour = locate.DECOYS[colour]
    assert sorted(cycle) == sorted(locate.COLOURS) and colour == "red"
    # The teacher is right when it looks for the asked colour, and by luck otherwise (its decoy's
    # square shares the quadrant): about 40% + 60% / 4.
    answers = [s["answer"][-1]["content"] for s in locate.tool_sft_rows("train")]
    correct = sum(a == f"<answer>{r['answer']}</answer>" for a, r in zip(answers, rows)) / len(rows)
    assert 0.45 < correct < 0.65, correct


@pytest.mark.long  # a check of the demo's premise, not of rlstack
def test_without_the_tool_the_model_stays_near_chance(tmp_path):
    """The tool is what the visual demo learns: the same tiny vision-language model, supervised on
    the right answers with no tool (`locate_answer_sft`), stays near chance (25%) on held-out
    pictures, where the program is always right (test above)."""
    from rlstack.config import load_config
    from rlstack.demo import CONFIGS
    from rlstack.models.loading import write_model_dir
    from rlstack.sft import run_sft
    from rlstack.trainer import Trainer

    base = write_model_dir(tmp_path / "base", vision=True)
    common = [f"trainer.output_dir={tmp_path}", "trainer.logger=[file]"]
    sft = load_config(
        [
            f"config={CONFIGS / 'demo_visual_sft.yaml'}",
            f"worker.actor.model.model_path={base}",
            "data.train_files=builtin:locate_answer_sft@train",
            "data.max_response_length=32",
            "trainer.max_steps=80",
            "trainer.experiment_name=no_tool_sft",
            *common,
        ]
    )
    model = run_sft(sft)
    val = load_config(
        [
            f"config={CONFIGS / 'demo_visual_grpo.yaml'}",
            f"worker.actor.model.model_path={model}",
            "worker.rollout.agent.tools=[]",
            "data.train_files=builtin:locate@test",  # unused by a validation-only run; the smaller split
            "data.val_max_samples=160",
            "trainer.val_only=true",
            "trainer.experiment_name=no_tool_eval",
            *common,
        ]
    )
    accuracy = Trainer(val).fit()["val/locate/accuracy"]
    assert accuracy < 0.375, accuracy  # 160 pictures: chance is 25% +- 3.4%
