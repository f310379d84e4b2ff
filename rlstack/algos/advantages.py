"""Advantage estimators: pure functions from scores to token-level advantages.

GRPO (Shao et al., 2024, "DeepSeekMath", arXiv:2402.03300): each response's outcome reward is
compared with the other responses to the same prompt, A_i = (r_i - mean(r)) / (std(r) + eps),
and the same advantage is given to every sampled token of the response. With
`norm_by_std=False` the division is dropped, as in Dr. GRPO (Liu et al., 2025, arXiv:2503.20783).
Departures: `std` is the unbiased sample standard deviation (as veRL); a prompt with a single
response (no group) gets advantage 0 instead of NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import Enum

import torch


class AdvEstimator(str, Enum):
    GRPO = "grpo"


def group_index(uids: Sequence[str]) -> torch.Tensor:
    """Map each row's uid to a dense group id, in order of first appearance. -> [B] long."""
    ids: dict[str, int] = {}
    return torch.tensor([ids.setdefault(u, len(ids)) for u in uids], dtype=torch.long)


def grpo_advantages(
    scores: torch.Tensor,  # [B]
    groups: torch.Tensor,  # [B] long, dense group ids
    response_mask: torch.Tensor,  # [B, T]
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:  # [B, T]
    num_groups = int(groups.max()) + 1
    count = scores.new_zeros(num_groups).index_add_(0, groups, torch.ones_like(scores))  # [G]
    mean = scores.new_zeros(num_groups).index_add_(0, groups, scores) / count  # [G]
    sq_dev = (scores - mean[groups]) ** 2
    var = scores.new_zeros(num_groups).index_add_(0, groups, sq_dev) / (count - 1).clamp(min=1)
    std = var.sqrt()
    adv = scores - mean[groups]  # [B]
    if norm_by_std:
        adv = adv / (std[groups] + eps)
    adv = torch.where(count[groups] > 1, adv, torch.zeros_like(adv))
    return adv[:, None] * response_mask.to(adv.dtype)


ESTIMATORS: dict[AdvEstimator, Callable[..., torch.Tensor]] = {AdvEstimator.GRPO: grpo_advantages}
