"""The critic worker: value alignment with response tokens, a learning update, checkpoint round trip."""

from __future__ import annotations

from pathlib import Path

import torch

from rlstack.batch import Batch
from rlstack.config import CriticConfig, OptimConfig
from rlstack.workers.critic import CriticWorker


def _batch() -> Batch:
    # two rows with different prompts of 3 columns, then a response of 3 (the second row ends in padding)
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 10], [5, 6, 13, 11, 12, 0]])
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    response_mask = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 0]])
    returns = torch.tensor([[0.0, 0.0, 0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, -1.0, -1.0, 0.0]])
    return Batch(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "response_mask": response_mask,
            "returns": returns,
        }
    )


def test_new_value_head_starts_at_zero_and_values_sit_on_response_tokens(tiny_model_dir: Path):
    critic = CriticWorker(CriticConfig(), str(tiny_model_dir), total_steps=10)
    b = critic.compute_values(_batch())
    assert torch.equal(b["values"], torch.zeros(2, 6))
    with torch.no_grad():
        critic.model.score.weight.normal_()
    b = critic.compute_values(_batch())
    assert torch.equal(b["values"] != 0, b["response_mask"].bool())


def test_updates_fit_the_returns_and_report_metrics(tiny_model_dir: Path, tmp_path: Path):
    cfg = CriticConfig(
        optim=OptimConfig(lr=1e-2), micro_batch_size_per_device_for_update=1, cliprange_value=10.0
    )
    critic = CriticWorker(cfg, str(tiny_model_dir), total_steps=30)
    losses = []
    for _ in range(30):
        b = critic.compute_values(_batch())
        m = critic.update(b, mini_batch_size=2)
        losses.append(m["critic/vf_loss"])
    assert losses[-1] < 0.1 * losses[0]
    assert {
        "critic/vf_loss",
        "critic/vf_clipfrac",
        "critic/vf_explained_var",
        "critic/grad_norm",
        "critic/lr",
    } <= set(m)
    assert m["critic/vf_explained_var"] > 0.5

    critic.save_checkpoint(tmp_path)
    other = CriticWorker(cfg, str(tiny_model_dir), total_steps=30)
    other.load_checkpoint(tmp_path)
    assert torch.allclose(other.compute_values(_batch())["values"], critic.compute_values(_batch())["values"])


def test_values_in_training_equal_the_collected_values(tiny_model_dir: Path):
    """No dropout in the value head (transformers' token-classification head defaults to 0.1): the
    update's values of an unchanged critic are the values collected for the batch."""
    critic = CriticWorker(CriticConfig(), str(tiny_model_dir), total_steps=10)
    with torch.no_grad():
        critic.model.score.weight.normal_()
    collected = critic.compute_values(_batch())["values"]
    critic.model.train()
    assert torch.equal(critic._values(_batch()), collected)
