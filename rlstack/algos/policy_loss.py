"""Policy losses and their aggregation over tokens.

PPO clipped surrogate (Schulman et al., 2017, arXiv:1707.06347), per token:
    loss = max(-A * r, -A * clip(r, 1 - eps_low, 1 + eps_high)),  r = exp(logp - logp_old)
with separate lower and upper clip ranges (DAPO's clip-higher, Yu et al., 2025, arXiv:2503.14476).

Aggregation `token-mean` divides the sum over every sampled token of a mini-batch by that
mini-batch's token count; each micro-batch passes the mini-batch's count as `normalizer`, so that
gradient accumulation over micro-batches gives the same gradient as one big batch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class PolicyLossOutput(NamedTuple):
    loss: torch.Tensor  # [B, T] per-token loss (zero outside the mask)
    clipped: torch.Tensor  # [B, T] 1.0 where the clipped branch was taken
    approx_kl: torch.Tensor  # [B, T] logp_old - logp


def ppo_clip_loss(
    logprobs: torch.Tensor,  # [B, T]
    old_logprobs: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    clip_ratio_low: float,
    clip_ratio_high: float,
) -> PolicyLossOutput:
    mask = response_mask.to(logprobs.dtype)
    log_ratio = (logprobs - old_logprobs) * mask
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss = torch.maximum(unclipped, clipped) * mask
    return PolicyLossOutput(loss, (clipped > unclipped).to(mask.dtype) * mask, -log_ratio.detach())


def token_mean(
    values: torch.Tensor, mask: torch.Tensor, normalizer: float | torch.Tensor | None = None
) -> torch.Tensor:
    """Sum of `values` over masked tokens / `normalizer` (default: the masked token count). -> scalar"""
    total = (values * mask).sum()
    if normalizer is None:
        normalizer = mask.sum()
    return total / torch.as_tensor(normalizer, dtype=total.dtype).clamp(min=1)
