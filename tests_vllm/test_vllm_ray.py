"""Two Ray ranks, each with its own in-process vLLM engine: the policy is FSDP2-sharded over gloo,
its gathered weights stream into both engines after every update, and both follow it (the probe
check runs every step on each rank's engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_vllm_grpo import DIGITS, grpo_args

from rlstack.config import load_config
from rlstack.trainer import Trainer

ray = pytest.importorskip("ray")


def test_two_ray_ranks_with_vllm_engines_follow_the_sharded_policy(tiny_dir: Path, tmp_path: Path):
    reward = tmp_path / "digits.py"
    reward.write_text(DIGITS)
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    try:
        cfg = load_config(
            grpo_args(
                tiny_dir,
                tmp_path,
                f"worker.reward.reward_function={reward}:compute_score",
                "trainer.backend=ray",
                "trainer.n_gpus_per_node=2",
                "trainer.num_threads=1",
                "data.val_files=",
            )
        )
        trainer = Trainer(cfg)
        assert trainer.engine.name == "vllm"
        trainer.fit()
    finally:
        ray.shutdown()
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for m in rows:
        assert m["actor/grad_norm"] > 0 and m["rollout/weight_sync_mb"] > 0
        assert m["rollout/weight_sync_max_diff"] < 1e-3  # every rank's engine scores like the policy
