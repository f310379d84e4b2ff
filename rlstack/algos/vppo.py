"""VPPO: focus the policy gradient on the tokens that depend on the image.

Huang et al., 2025, "Spotlight on Token Perception for Multimodal Reinforcement Learning",
arXiv:2510.09285. The seed guide names only the switches (`use_vppo_on_perception`,
`top_p_perception_tokens`, `use_advantage_shaping`, `advantage_scaling_min`, `use_entropy_penalty`,
`entropy_penalty_coef`); the formulas below follow the official code, huaixuheqing/VPPO-RL
`verl/workers/actor/dp_actor.py`.

Visual dependency (`token_visual_dependency`). The paper measures how much a token's next-token
distribution moves when the image is perturbed (random patch blackening: 14-pixel patches, each
blacked out with probability 0.5), as KL(pi(.|s_t, I) || pi(.|s_t, I_masked)). Like the official
code, this estimates it from the sampled token alone with Schulman's k3: with
x = clamp(log p_masked(y_t) - log p(y_t), -20, 20), d_t = clamp(exp(x) - x - 1, 0, clamp_max)
(clamp_max = 10 there). That costs one more forward pass with the masked image and a [B, T]
column, not [B, T, V]. Both log-probs come from the policy before the update (`old_logprobs`).

Token-level gradient filtering (`perception_token_mask`, `top_p_perception_tokens`). Per response,
keep the ceil(top_p * n) tokens of highest dependency, n = that response's sampled tokens. The
mask multiplies the per-token policy loss; the official code still divides by every sampled
token (token-mean over `response_mask`), so dropped tokens count in the normaliser.

Trajectory-level advantage shaping (`advantage_shaping_scale`, `advantage_scaling_min` = m).
s_i = mean dependency over the sampled tokens of trajectory i, u_i = (s_i - min s) / (max s - min s),
scale_i = m + u_i * (1 - m) / mean(u). The least dependent trajectory gets m, the mean scale is
exactly 1 and the most dependent gets m + (1 - m) / mean(u). Every scale is 1 when fewer than two
trajectories have sampled tokens or max s - min s <= 1e-6; a row with no sampled token gets 1 and
is left out of min, max and mean. The advantages of trajectory i are multiplied by scale_i.

Entropy penalty (`entropy_penalty`, `use_entropy_penalty`, `entropy_penalty_coef`). The official
code adds coef * token-mean(-log pi(y_t)) over all sampled tokens (not only the perception tokens)
to the loss: -log pi(y_t) is a one-sample estimate of the entropy, and minimising it raises the
probability of the sampled tokens, lowering entropy. So the input is the policy's log-probs of
the sampled tokens, with gradient, not an entropy column.

Departures:
- The official code takes min s and max s over the mini-batch but mean(u) over each micro-batch
  (so scales average 1 per micro-batch) and clamps u into [0, 1]. Here all three come from the rows
  passed in, meant to be the mini-batch; u needs no clamp.
- Ties in the top-p selection go to the earlier token (stable sort); the official order among ties
  is unspecified. k has a 1e-9 slack against float error (see `entropy.top_fraction_mask`).
- The penalty is returned per token, zero outside the mask; aggregating it with the policy loss's
  token-mean gives the official coef * masked_mean(-log p).
"""

from __future__ import annotations

import torch

from rlstack.algos.entropy import top_fraction_mask


def token_visual_dependency(
    logprobs: torch.Tensor,  # [B, T] log p(y_t | s_t, image), old policy
    masked_logprobs: torch.Tensor,  # [B, T] log p(y_t | s_t, patch-masked image), same policy
    response_mask: torch.Tensor,  # [B, T]
    clamp_max: float,
) -> torch.Tensor:  # [B, T], in [0, clamp_max], zero outside the mask
    """k3 estimate of KL(pi(.|image) || pi(.|masked image)) at each sampled token."""
    log_ratio = (masked_logprobs - logprobs).clamp(min=-20.0, max=20.0)
    k3 = torch.exp(log_ratio) - log_ratio - 1.0
    return torch.where(response_mask.bool(), k3.clamp(min=0.0, max=clamp_max), 0.0)


def perception_token_mask(
    dependency: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    top_p: float,
) -> torch.Tensor:  # [B, T] bool
    """Per response, the ceil(top_p * n) sampled tokens of highest visual dependency."""
    return top_fraction_mask(dependency, response_mask, top_p)


def advantage_shaping_scale(
    dependency: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    scaling_min: float,
) -> torch.Tensor:  # [B], no gradient
    """Per-trajectory advantage scale: `scaling_min` for the least visually dependent trajectory,
    rising linearly with mean dependency, batch mean 1 (formula in the module docstring)."""
    if not 0.0 <= scaling_min <= 1.0:
        raise ValueError(f"scaling_min must be in [0, 1], got {scaling_min}")
    mask = response_mask.to(dependency.dtype)
    n = mask.sum(dim=-1)  # [B]
    score = (dependency.detach() * mask).sum(dim=-1) / n.clamp(min=1)  # [B] mean dependency
    scale = torch.ones_like(score)
    valid = n > 0
    if int(valid.sum()) < 2:
        return scale
    low, high = score[valid].min(), score[valid].max()
    if float(high - low) <= 1e-6:
        return scale
    unit = (score - low) / (high - low)  # [B], in [0, 1] on valid rows
    shaped = scaling_min + unit * (1.0 - scaling_min) / unit[valid].mean()
    return torch.where(valid, shaped, scale)


def entropy_penalty(
    logprobs: torch.Tensor,  # [B, T] current policy, log p(y_t), with gradient
    response_mask: torch.Tensor,  # [B, T]
    coef: float,
) -> torch.Tensor:  # [B, T] per-token term to add to the loss, zero outside the mask
    """coef * -log p(y_t) on sampled tokens: a sample estimate of entropy, penalised."""
    return torch.where(response_mask.bool(), -coef * logprobs, 0.0)
