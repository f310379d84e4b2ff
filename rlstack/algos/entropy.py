"""Train only on the high-entropy "forking" tokens.

Wang et al., 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective
Reinforcement Learning for LLM Reasoning", arXiv:2506.01939: restricting the policy-gradient loss
to the 20% of sampled tokens with the highest entropy matches full-token updates on Qwen3-8B and
beats them on larger models. As in the authors' code (`get_global_entropy_top_mask` in
zhouxiangxin1998/Beyond-the-80-20-Rule-RLVR), the fraction is taken over every sampled token of the
batch, not per response: `high_entropy_mask` keeps the k = ceil(top_quantile * N) highest-entropy
of the N sampled tokens.

Departures:
- Ties at the threshold go to the earlier position (row-major: lower row, then lower token), so
  exactly k tokens are kept; the reference uses `torch.topk`, whose order among ties is unspecified.
  A threshold rule (entropy >= quantile) would keep every tied token and could keep more than k.
- `top_quantile=0` keeps no token; the reference keeps at least one.
- k is computed with a 1e-9 slack so that float error (0.7 * 10 = 7.000000000000001) adds no token.
- The reference passes the mask as the loss mask, so its token-mean divides by the selected tokens.
  Here the mask is returned and the caller chooses the normaliser.

`top_fraction_mask` is the per-row selection both this module and VPPO's perception mask use.
"""

from __future__ import annotations

import torch


def top_fraction_mask(
    values: torch.Tensor,  # [N, T]
    mask: torch.Tensor,  # [N, T], nonzero where a value may be chosen
    fraction: float,
) -> torch.Tensor:  # [N, T] bool
    """In each row, the ceil(fraction * n) masked-in positions with the largest values (n = masked-in
    positions of that row); ties go to the earlier position. Masked-out positions are never chosen."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    valid = mask.bool()
    k = torch.ceil(valid.sum(dim=-1).to(torch.float64) * fraction - 1e-9).long()  # [N]
    ranked = values.detach().masked_fill(~valid, float("-inf"))
    order = torch.sort(ranked, dim=-1, descending=True, stable=True).indices  # [N, T]
    positions = torch.arange(values.shape[-1], device=values.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(-1, order, positions)  # [N, T] rank of each position
    return (rank < k[:, None]) & valid


def high_entropy_mask(
    entropy: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    top_quantile: float,
) -> torch.Tensor:  # [B, T] bool
    """The ceil(top_quantile * N) highest-entropy of the batch's N sampled tokens."""
    flat = top_fraction_mask(entropy.reshape(1, -1), response_mask.reshape(1, -1), top_quantile)
    return flat.reshape(entropy.shape)
