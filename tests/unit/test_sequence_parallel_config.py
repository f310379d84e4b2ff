"""`worker.actor.ulysses_size` is checked at load: ranks it divides, the layout and kernel it needs, the heads
it splits, and the mini-batch split over data-parallel groups rather than ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlstack.config import Config, load_config
from rlstack.config.schema import config_problems


def model_dir(tmp_path: Path, heads: int, kv_heads: int, vision: bool = False) -> str:
    """A folder whose config.json names the language model's heads (a Qwen-VL config nests them)."""
    text = {"num_attention_heads": heads, "num_key_value_heads": kv_heads}
    (tmp_path / "config.json").write_text(json.dumps({"text_config": text} if vision else text))
    return str(tmp_path)


def problems(path: str, ulysses_size: int, **settings) -> list[str]:
    """The problems of a 4-rank Ray run with the sequence split over `ulysses_size` ranks and `settings`
    (`section__field`: trainer, actor, model, rollout) that mention it."""
    cfg: Config = load_config(
        [
            "trainer.backend=ray",
            "trainer.n_gpus_per_node=4",
            "worker.actor.padding_free=true",
            f"worker.actor.model.model_path={path}",
        ]
    )
    cfg.worker.actor.ulysses_size = ulysses_size
    sections = {
        "trainer": cfg.trainer,
        "actor": cfg.worker.actor,
        "model": cfg.worker.actor.model,
        "rollout": cfg.worker.rollout,
        "critic": cfg.worker.critic,
        "algorithm": cfg.algorithm,
    }
    for key, value in settings.items():
        section, name = key.split("__")
        setattr(sections[section], name, value)
    return [p for p in config_problems(cfg, machine=False) if "ulysses" in p]


def test_a_run_that_can_split_its_sequences_loads(tmp_path):
    assert problems(model_dir(tmp_path, 4, 2), 2) == []
    assert problems(model_dir(tmp_path, 4, 2, vision=True), 2) == []
    assert load_config([]).worker.actor.ulysses_size == 1  # off by default


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"trainer__backend": "local"},
            "and the run has one process (trainer.backend=local): set trainer.backend=ray",
        ),
        ({"trainer__n_gpus_per_node": 3}, "and the run has 3 policy ranks: set trainer.backend=ray with"),
        (
            {"actor__padding_free": False},
            "splits the packed sequence of the padding-free layout: set worker.actor.padding_free=true",
        ),
        ({"model__attn_implementation": "eager"}, "set worker.actor.model.attn_implementation=sdpa"),
        (
            {"actor__global_batch_size": 3, "rollout__n": 1},
            "do not split evenly over 2 data-parallel groups (4 ranks / worker.actor.ulysses_size=2)",
        ),
        (
            {"algorithm__adv_estimator": "gae", "critic__padding_free": False},
            "splits the critic's sequences too, which needs its padding-free layout: set worker.critic.padding_free=true",
        ),
    ],
    ids=["one-process", "ranks", "padded", "kernel", "mini-batch", "padded-critic"],
)
def test_each_setting_sequence_parallelism_needs_is_named(tmp_path, settings, message):
    found = problems(model_dir(tmp_path, 4, 2), 2, **settings)
    assert len(found) == 1 and message in found[0], found


def test_heads_that_do_not_split_say_which_sizes_do(tmp_path):
    (found,) = problems(model_dir(tmp_path, 12, 2), 4)
    assert "must divide the model's 12 attention heads and 2 key/value heads" in found
    assert found.endswith("set it to one of 1, 2")
