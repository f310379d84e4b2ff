"""The critic's clipped value loss and its diagnostics.

PPO's value clipping (Schulman et al., 2017, arXiv:1707.06347, as in OpenAI baselines and veRL):
    v_clip = v_old + clip(v - v_old, -eps, +eps)
    loss   = 0.5 * max((v - R)^2, (v_clip - R)^2)
per sampled token; the critic averages it over the mini-batch's sampled tokens (token-mean, veRL's
default `critic.loss_agg_mode`; rlstack has no other mode for the critic). Departure: none beyond
taking the element-wise max of the two squared errors at every token (veRL does the same).
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class ValueLossOutput(NamedTuple):
    loss: torch.Tensor  # [B, T] per-token loss, zero outside the mask
    clipped: torch.Tensor  # [B, T] 1.0 where the clipped error was the larger one


def clipped_value_loss(
    values: torch.Tensor,  # [B, T] current critic values
    old_values: torch.Tensor,  # [B, T] values when the batch was collected
    returns: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    cliprange_value: float,
) -> ValueLossOutput:
    sampled = response_mask.bool()
    # off the sampled tokens returns and old values may be anything (NaN): read them only on those tokens
    returns, old_values = torch.where(sampled, returns, 0.0), torch.where(sampled, old_values, 0.0)
    clipped_values = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    err = (values - returns) ** 2
    err_clipped = (clipped_values - returns) ** 2
    loss = torch.where(sampled, 0.5 * torch.maximum(err, err_clipped), 0.0)
    return ValueLossOutput(loss, ((err_clipped > err) & sampled).to(values.dtype))


def explained_variance(
    values: torch.Tensor, returns: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """1 - Var[R - V] / Var[R] over sampled tokens (1: perfect critic, 0: no better than a constant). -> scalar"""
    m = response_mask.bool()
    r, v = returns[m].float(), values[m].float()
    var_r = r.var(unbiased=False)
    if var_r == 0:
        return torch.tensor(float("nan"))
    return 1.0 - (r - v).var(unbiased=False) / var_r
