"""One vLLM engine split over two Ray ranks (`worker.rollout.tensor_parallel_size=2`, vLLM's external
launcher over the trainer's own process group): rank 0 leads the rollout, rank 1 follows its calls, and
each trains on its own prompts' trajectories. The split engine samples what two whole engines sample, and
follows the sharded policy after every sync (the probe check runs every step on both ranks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_vllm_grpo import DIGITS, grpo_args

from rlstack.config import load_config
from rlstack.trainer import Trainer

ray = pytest.importorskip("ray")


def _two_ray_ranks(tiny_dir: Path, out: Path, reward: Path, tensor_parallel: int) -> list[dict]:
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    try:
        cfg = load_config(
            grpo_args(
                tiny_dir,
                out,
                f"worker.reward.reward_function={reward}:compute_score",
                "trainer.n_gpus_per_node=2",
                f"worker.rollout.tensor_parallel_size={tensor_parallel}",
                "trainer.num_threads=1",
                "data.val_files=",
            )
        )
        assert cfg.trainer.backend == "ray"
        Trainer(cfg).fit()
    finally:
        ray.shutdown()
    return [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]


def test_an_engine_split_over_two_ranks_samples_as_whole_engines_and_follows_the_policy(
    tiny_dir: Path, tmp_path: Path
):
    reward = tmp_path / "digits.py"
    reward.write_text(DIGITS)
    split = _two_ray_ranks(tiny_dir, tmp_path / "split", reward, 2)
    whole = _two_ray_ranks(tiny_dir, tmp_path / "whole", reward, 1)
    assert [r["step"] for r in split] == [1, 2]
    for m in split:
        assert m["actor/grad_norm"] > 0 and m["rollout/weight_sync_mb"] > 0
        assert m["rollout/weight_sync_max_diff"] < 1e-3  # both ranks' slices score like the policy
    # the same prompts, seeds and weights: the same trajectories as one whole engine per rank
    for key in ("response_length/mean", "critic/score/mean", "prompt_length/mean"):
        assert split[0][key] == pytest.approx(whole[0][key], abs=1e-6), key
