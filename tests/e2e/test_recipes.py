"""Every named recipe has a config, and each runs a step on the tiny model."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from e2e_runs import (
    PARITY_REWARD,
)

from rlstack.config import load_config
from rlstack.trainer import Trainer

RECIPES = sorted((Path(__file__).parents[2] / "examples" / "recipes").glob("*.yaml"))


def test_every_named_recipe_has_a_config():
    names = {p.stem for p in RECIPES}
    assert {"grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "gspo", "cispo", "ppo_gae"} <= names


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_each_recipe_runs_a_step_on_the_tiny_model(tiny_model_dir: Path, tmp_path: Path, recipe: Path):
    reward = tmp_path / "parity.py"
    reward.write_text(PARITY_REWARD)  # mixed groups, so DAPO's filter can fill a batch from a random model
    cfg = load_config(
        [
            f"config={recipe}",
            f"worker.actor.model.model_path={tiny_model_dir}",
            f"trainer.output_dir={tmp_path}",
            f"worker.reward.reward_function={reward}:compute_score",
            "algorithm.filter_key=overall",
            "data.rollout_batch_size=4",
            "worker.actor.global_batch_size=4",
            "worker.critic.global_batch_size=4",
            "worker.rollout.n=4",
            "worker.actor.micro_batch_size_per_device_for_update=8",
            "worker.critic.micro_batch_size_per_device_for_update=8",
            "trainer.max_steps=1",
            "trainer.val_before_train=false",
            "data.val_files=",
            "trainer.logger=[file]",
            "trainer.save_model_only=true",
        ]
    )
    m = Trainer(cfg).fit()
    assert math.isfinite(m["actor/pg_loss"])
