"""Reward-side batches as the rollout and data rooms leave them, shared by the reward tests."""

from __future__ import annotations

import torch

from rlstack.batch import Batch


def make_batch(responses: list[str], truths: list[str]) -> Batch:
    """Rows as the rollout and data rooms leave them; row i has i + 1 response tokens."""
    n = len(responses)
    response_mask = torch.zeros(n, 8, dtype=torch.long)
    for i in range(n):
        response_mask[i, 2 : 3 + i] = 1
    return Batch(
        {
            "response_text": responses,
            "response_mask": response_mask,
            "ground_truth": truths,
            "prompt": [f"prompt {i}" for i in range(n)],
            "data_source": ["addition"] * n,
            "extra": [{"i": i} for i in range(n)],
            "where": [f"train.jsonl:{i + 1}" for i in range(n)],
        }
    )
