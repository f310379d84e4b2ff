"""Every named recipe has a config, and each example learns as shipped: it starts from the demo's warm start
(`builtin:tiny-qwen2-addition`) and runs at its own batch sizes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rlstack.config import BUILTIN_WARM_MODEL, load_config
from rlstack.sft import build_warm_models, warm_model_dir
from rlstack.trainer import Trainer

RECIPES = sorted((Path(__file__).parents[2] / "examples" / "recipes").glob("*.yaml"))


def test_every_named_recipe_has_a_config():
    names = {p.stem for p in RECIPES}
    assert {"grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "gspo", "cispo", "ppo_gae"} <= names


EXAMPLES = [Path(__file__).parents[2] / "examples" / "grpo_addition.yaml", *RECIPES]
IN_MAKE_TEST = {"grpo_addition", "dapo"}
"""The examples `make test` runs two steps of (the plain one, DAPO's filter); `make test-long` the rest."""


def test_no_example_starts_from_random_weights():
    """A randomly initialised model answers nothing right, so every step would log score 0, pg_loss 0,
    grad_norm 0: each example starts from a model that can learn its task."""
    for path in EXAMPLES:
        model = load_config([f"config={path}"]).worker.actor.model.model_path
        assert model == BUILTIN_WARM_MODEL, (path.name, model)


@pytest.fixture(scope="module")
def warm_model() -> Path:
    """`builtin:tiny-qwen2-addition`, built as a run that first names it builds it (the demo's warm start)."""
    cfg = load_config([f"config={EXAMPLES[0]}"])
    build_warm_models(cfg)
    out = warm_model_dir()
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    build_warm_models(cfg)  # built once: the second call finds it
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first one builds the warm start (300 supervised steps) in its setup
@pytest.mark.parametrize(
    "example",
    [pytest.param(p, marks=() if p.stem in IN_MAKE_TEST else pytest.mark.long, id=p.stem) for p in EXAMPLES],
)
def test_each_example_learns_as_shipped(warm_model: Path, tmp_path: Path, example: Path):
    """Two steps at the example's own batch sizes, from its own model: rewards to learn from (right and
    wrong answers), a gradient, and for DAPO a batch its filter filled; the critic of the GAE recipe at
    the recipe's sizes."""
    cfg = load_config(
        [
            f"config={example}",
            f"trainer.output_dir={tmp_path}",
            "trainer.max_steps=2",
            "trainer.val_before_train=false",
            "data.val_files=",
            "trainer.logger=[file]",
            "trainer.save_model_only=true",
        ]
    )
    trainer = Trainer(cfg)
    last = trainer.fit()
    assert 0 < last["critic/score/mean"] < 1  # some answers right, some wrong: an advantage to follow
    assert last["actor/grad_norm"] > 0 and math.isfinite(last["actor/pg_loss"])
    if cfg.algorithm.online_filtering:
        assert (
            last["online_filtering/kept_groups_per_try"] > 0
        )  # mixed groups found (a full batch, or it stops)
    if cfg.algorithm.adv_estimator == "gae":
        assert math.isfinite(last["critic/vf_loss"]) and last["critic/grad_norm"] > 0
