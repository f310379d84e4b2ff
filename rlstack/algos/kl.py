"""KL penalties between the policy and the reference policy, per token, and the adaptive KL coefficient.

The estimators of KL(pi || pi_ref) from tokens sampled from pi are Schulman's
(http://joschu.net/blog/kl-approx.html), with d = logp - logp_ref:

- `kl` (k1): d. Unbiased, high variance, can be negative.
- `abs`: |d|.
- `mse` (k2): d^2 / 2. Biased, low variance, never negative.
- `low_var_kl` (k3): exp(-d) + d - 1. Unbiased, low variance, never negative. As in veRL, -d is
  clamped to [-20, 20] before `exp` (so the gradient stays finite) and the value to [-10, 10], so
  that rare huge ratios cannot dominate a step; beyond these bounds the gradient is zero.
- `full`: the exact KL over the vocabulary, sum_v p_v (log p_v - log q_v), from the logits
  [B, T, V] of both models (`kl_full`). It needs the full distributions, not the log-probs of the
  sampled tokens, so it is not in `KL_ESTIMATORS` and `kl_penalty` refuses it.

Used as a loss, the gradient of k1 and k3 in expectation is not the gradient of the KL; that of k2
is. The `+` variants (`kl+`, `abs+`, `mse+`, `low_var_kl+`) keep the value of their estimator and
take the gradient of k2, by the straight-through k.detach() + k2 - k2.detach(), as veRL's
`kl_penalty` does for names ending in "+". `mse+` is `mse`.

`kl_in_reward` subtracts beta * KL (the estimator between the behaviour policy's and the reference's
log-probs of each sampled token) from the rewards, as veRL's `apply_kl_penalty`: from the token
rewards, for the estimators that read them (`gae`, `reinforce_plus_plus`), and from each row's
outcome score as the sum of its tokens' penalties, which is what veRL's group estimators (GRPO,
RLOO, ...) read, since they sum the token-level rewards. So the KL reaches the advantages with
every estimator. The reference is read only on sampled tokens: a `-inf` on padding changes nothing.

`adaptive_kl_coef` is one step of the proportional controller of Ziegler et al., 2019
(arXiv:1909.08593): e = clip(KL / target - 1, -0.2, 0.2), beta <- beta (1 + e n_steps / horizon).
The paper writes the gain as K_beta; n_steps / horizon is veRL's (and TRL's) form of it
(`AdaptiveKLController.update`), without the controller's state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from rlstack.config.algorithm import KLPenaltyName
from rlstack.config.fields import choice_enum

KLPenalty = choice_enum("KLPenalty", KLPenaltyName, __name__)
"""`algorithm.kl_penalty`'s choices: KL, ABS, MSE, LOW_VAR_KL, their `+` forms KL_PLUS, ..., and FULL."""


def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 = logp - ref per token. [B, T], [B, T] -> [B, T]"""
    return logprobs - ref_logprobs


def kl_abs(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """|logp - ref| per token. [B, T], [B, T] -> [B, T]"""
    return (logprobs - ref_logprobs).abs()


def kl_mse(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 = (logp - ref)^2 / 2 per token. [B, T], [B, T] -> [B, T]"""
    return 0.5 * (logprobs - ref_logprobs).square()


def low_var_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 per token. [B, T], [B, T] -> [B, T]"""
    log_ratio = (ref_logprobs - logprobs).clamp(min=-20.0, max=20.0)
    return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, min=-10.0, max=10.0)


def _with_k2_gradient(
    value: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor
) -> torch.Tensor:
    """The value of `value`, the gradient of k2."""
    k2 = kl_mse(logprobs, ref_logprobs)
    return value.detach() + (k2 - k2.detach())


def kl_k1_plus(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1's value, k2's gradient. [B, T], [B, T] -> [B, T]"""
    return _with_k2_gradient(kl_k1(logprobs, ref_logprobs), logprobs, ref_logprobs)


def kl_abs_plus(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """|d|'s value, k2's gradient. [B, T], [B, T] -> [B, T]"""
    return _with_k2_gradient(kl_abs(logprobs, ref_logprobs), logprobs, ref_logprobs)


def kl_mse_plus(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 (its own straight-through is itself). [B, T], [B, T] -> [B, T]"""
    return kl_mse(logprobs, ref_logprobs)


def low_var_kl_plus(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3's value, k2's gradient. [B, T], [B, T] -> [B, T]"""
    return _with_k2_gradient(low_var_kl(logprobs, ref_logprobs), logprobs, ref_logprobs)


def kl_full(logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """Exact KL(softmax(logits) || softmax(ref_logits)) per position. [B, T, V], [B, T, V] -> [B, T]

    Pass logits already divided by the sampling temperature, as for the log-probs."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    ref_logp = torch.log_softmax(ref_logits.float(), dim=-1)
    return (logp.exp() * (logp - ref_logp)).sum(-1).to(logits.dtype)


KL_ESTIMATORS: dict[KLPenalty, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    KLPenalty.KL: kl_k1,
    KLPenalty.ABS: kl_abs,
    KLPenalty.MSE: kl_mse,
    KLPenalty.LOW_VAR_KL: low_var_kl,
    KLPenalty.KL_PLUS: kl_k1_plus,
    KLPenalty.ABS_PLUS: kl_abs_plus,
    KLPenalty.MSE_PLUS: kl_mse_plus,
    KLPenalty.LOW_VAR_KL_PLUS: low_var_kl_plus,
}


def kl_penalty(kind: KLPenalty, logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """The per-token estimator `kind` from sampled-token log-probs. [B, T], [B, T] -> [B, T]"""
    kind = KLPenalty(kind)
    if kind is KLPenalty.FULL:
        raise ValueError(
            "kl_penalty 'full' needs the logits of both models, not sampled-token log-probs: "
            "call kl_full(logits, ref_logits)"
        )
    return KL_ESTIMATORS[kind](logprobs, ref_logprobs)


def adaptive_kl_coef(coef: float, observed_kl: float, target: float, horizon: float, n_steps: int) -> float:
    """The KL coefficient after one controller step that saw `observed_kl` over `n_steps` samples."""
    if not target > 0 or not horizon > 0:
        raise ValueError(
            f"the adaptive KL controller needs target > 0 and horizon > 0, got {target}, {horizon}"
        )
    error = min(max(observed_kl / target - 1.0, -0.2), 0.2)
    return coef * (1.0 + error * n_steps / horizon)


class RewardKL(NamedTuple):
    token_rewards: torch.Tensor  # [B, T] the token rewards minus beta * KL on each sampled token
    scores: torch.Tensor  # [B] the outcome scores minus beta * the row's summed KL
    mean_kl: float  # mean over rows (with a sampled token) of the row's mean per-token KL, before beta


def kl_in_reward(
    token_rewards: torch.Tensor,  # [B, T] outcome score at the last sampled token, 0 elsewhere
    scores: torch.Tensor,  # [B]
    old_logprobs: torch.Tensor,  # [B, T] behaviour policy
    ref_logprobs: torch.Tensor,  # [B, T] reference policy
    response_mask: torch.Tensor,  # [B, T]
    kind: KLPenalty,
    coef: float,
) -> RewardKL:
    """Rewards with the in-reward KL penalty subtracted, for every estimator (see the module docstring)."""
    sampled = response_mask.bool()
    kl = torch.where(
        sampled, kl_penalty(kind, old_logprobs, torch.where(sampled, ref_logprobs, old_logprobs)), 0.0
    )
    per_row = kl.sum(-1)  # [B]
    lengths = sampled.sum(-1)  # [B]
    mean_kl = float((per_row / lengths.clamp(min=1)).mean())
    return RewardKL(token_rewards - coef * kl, scores - coef * per_row, mean_kl)
