"""Two GRPO steps with the vLLM engine on the tiny Qwen2: the engine follows the policy after every
sync (checked on a probe each step), its behaviour log-probs feed the rollout correction, and a
sync that does nothing is caught."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlstack.config import load_config
from rlstack.errors import RLStackError
from rlstack.trainer import Trainer


def grpo_args(model_dir: Path, out: Path, *extra: str) -> list[str]:
    return [
        f"worker.actor.model.model_path={model_dir}",
        f"trainer.output_dir={out}",
        "worker.rollout.name=vllm",
        "worker.rollout.check_weight_sync=true",
        "worker.rollout.weight_sync_tolerance=1e-3",
        "data.rollout_batch_size=4",
        "worker.actor.global_batch_size=4",
        "worker.rollout.n=4",
        "worker.actor.micro_batch_size_per_device_for_update=16",
        "data.max_response_length=8",
        "data.val_max_samples=8",
        "worker.actor.optim.lr=1e-2",
        "worker.actor.rollout_correction=tis",
        "trainer.max_steps=2",
        "trainer.logger=[file]",
        "trainer.save_model_only=true",
        "trainer.num_threads=2",
        *extra,
    ]


DIGITS = """
REWARD_TYPE = "sequential"

def compute_score(x):
    text = x["response"]
    return {"overall": sum(c.isdigit() for c in text) / max(1, len(text))}
"""


def test_two_grpo_steps_with_vllm_follow_the_policy_and_catch_a_skipped_sync(tiny_dir: Path, tmp_path: Path):
    reward = tmp_path / "digits.py"
    reward.write_text(DIGITS)
    score = f"worker.reward.reward_function={reward}:compute_score"
    cfg = load_config(grpo_args(tiny_dir, tmp_path / "ok", score))
    trainer = Trainer(cfg)
    assert trainer.engine.name == "vllm" and not trainer.engine.shares_policy_weights
    trainer.fit()
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    metrics = {r["step"]: r for r in rows}
    for step in (1, 2):
        m = metrics[step]
        assert m["actor/grad_norm"] > 0  # the policy moved ...
        assert m["rollout/weight_sync_max_diff"] < 1e-3  # ... and the engine followed
        assert m["timing_s/sync"] > 0 and m["timing_s/gen"] > 0
        assert "val/addition/accuracy" in metrics[2]
    # vLLM's behaviour log-probs feed the rollout correction: in float32 the importance weight is ~1
    assert metrics[1]["actor/rollout_correction_weight"] == pytest.approx(1.0, abs=1e-3)

    cfg = load_config(grpo_args(tiny_dir, tmp_path / "stale", score))
    trainer = Trainer(cfg)
    trainer.groups["rollout"].worker.engine.update_weights = lambda weights, version, **kw: (
        None
    )  # a sync that does nothing
    with pytest.raises(RLStackError, match="not sampling from the weights being trained"):
        trainer.fit()


def test_a_lora_policy_sends_vllm_its_merged_weights(tiny_dir: Path, tmp_path: Path):
    """With LoRA the engine is sent the base weights with the adapters merged in: it follows the policy."""
    reward = tmp_path / "digits.py"
    reward.write_text(DIGITS)
    cfg = load_config(
        grpo_args(
            tiny_dir,
            tmp_path / "lora",
            f"worker.reward.reward_function={reward}:compute_score",
            "worker.actor.model.lora.rank=8",
            "worker.actor.model.lora.alpha=16",
            "worker.actor.optim.lr=5e-2",
        )
    )
    trainer = Trainer(cfg)
    assert trainer.groups["actor"].worker.lora
    trainer.fit()
    rows = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    metrics = {r["step"]: r for r in rows}
    for step in (1, 2):
        assert metrics[step]["actor/grad_norm"] > 0
        assert metrics[step]["rollout/weight_sync_max_diff"] < 1e-3
    assert metrics[2]["rollout/weight_sync_mb"] > 0  # whole merged tensors went over
