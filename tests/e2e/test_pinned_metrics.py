"""Seeded runs of the embedded default whose metrics are pinned (see `pinned.py`): single-turn GRPO
off-policy with validation, ReMax's greedy baseline, and dynamic sampling with top-p / top-k."""

from __future__ import annotations

from pathlib import Path

import pytest
from pinned import assert_matches_pinned, deterministic_metrics

from rlstack.config import load_config
from rlstack.trainer import Trainer

# The random tiny model never answers an addition right: score the share of digits in the response
# (plus a bonus for ending), so that advantages, losses and gradients are not all zero.
REWARD = """
REWARD_TYPE = "batch"

def compute_score(reward_inputs):
    out = []
    for x in reward_inputs:
        text = x["response"]
        digits = sum(c.isdigit() for c in text) / max(1, len(text))
        out.append({"overall": digits + 0.5 * (len(text) < 4), "accuracy": digits})
    return out
"""
NON_DETERMINISTIC = ("timestamp", "timing_s/", "perf/throughput", "perf/time_per_step", "perf/max_")

RUNS = {
    # off-policy (two mini-batches), so old log-probs, the update and validation all run
    "grpo": ["data.rollout_batch_size=4", "worker.actor.global_batch_size=2"],
    # the greedy baseline goes through the same generation path as the samples
    "remax": [
        "algorithm.adv_estimator=remax",
        "data.rollout_batch_size=4",
        "worker.actor.global_batch_size=4",
    ],
    # dynamic sampling: several generation rounds per step
    "dapo": [
        "data.rollout_batch_size=2",
        "worker.actor.global_batch_size=2",
        "algorithm.online_filtering=true",
        "algorithm.filter_key=accuracy",
        "worker.rollout.top_p=0.9",
        "worker.rollout.top_k=20",
    ],
}


@pytest.fixture(scope="module")
def short_answers(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model after a few supervised steps on additions: its responses end at EOS after
    a few tokens, at different lengths, so finished rows sit next to running ones while sampling."""
    from rlstack.sft import run_sft

    out = tmp_path_factory.mktemp("pinned_sft")
    cfg = load_config(
        [
            f"worker.actor.model.model_path={tiny_model_dir}",
            f"trainer.output_dir={out}",
            "data.train_files=builtin:addition@train",
            "data.val_files=",
            "data.rollout_batch_size=32",
            "data.max_response_length=8",
            "worker.actor.micro_batch_size_per_device_for_update=32",
            "worker.actor.optim.lr=3e-3",
            "trainer.max_steps=20",
            "trainer.logger=[file]",
            "trainer.num_threads=1",
        ]
    )
    return run_sft(cfg)


def _run(model: Path, out: Path, extra: list[str]) -> dict[str, dict]:
    reward = out / "reward.py"
    out.mkdir(parents=True, exist_ok=True)
    reward.write_text(REWARD)
    cfg = load_config(
        [
            f"worker.reward.reward_function={reward}:compute_score",
            f"worker.actor.model.model_path={model}",
            f"trainer.output_dir={out}",
            "worker.rollout.n=4",
            "worker.actor.micro_batch_size_per_device_for_update=8",
            "data.max_response_length=6",
            "data.val_max_samples=8",
            "worker.actor.optim.lr=1e-3",
            "trainer.max_steps=3",
            "trainer.val_before_train=true",
            "trainer.logger=[file]",
            "trainer.save_model_only=true",
            "trainer.num_threads=1",
            *extra,
        ]
    )
    Trainer(cfg).fit()
    return deterministic_metrics(cfg.run_dir)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_seeded_metrics_match_the_pinned_values(short_answers: Path, tmp_path: Path, name: str):
    assert_matches_pinned(name, _run(short_answers, tmp_path, RUNS[name]))
