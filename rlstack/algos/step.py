"""One step's algorithm glue, as pure functions of the batch's tensors: the in-reward KL and its
adaptive coefficient, the advantages, VPPO's advantage shaping, and VPPO's per-token visual
dependency. The trainer calls them between the workers' passes; they read no config and keep no state
(the KL coefficient goes in and comes out)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from rlstack.algos.advantages import (
    AdvantageInputs,
    AdvantageParams,
    AdvEstimator,
    compute_advantages,
    outcome_token_rewards,
)
from rlstack.algos.groups import group_index
from rlstack.algos.kl import KLPenalty, adaptive_kl_coef, kl_in_reward
from rlstack.algos.vppo import advantage_shaping_scale, perception_token_mask, token_visual_dependency


class StepParams(NamedTuple):
    estimator: AdvEstimator
    advantage: AdvantageParams
    kl_in_reward: KLPenalty | None = None
    """The KL estimator subtracted from the rewards (None: no in-reward KL)."""
    adaptive_kl: tuple[float, float] | None = None
    """(target, horizon) of the adaptive in-reward KL coefficient (None: fixed)."""
    shaping_min: float | None = None
    """VPPO's advantage shaping: the smallest scale (None: no shaping)."""


class StepAdvantages(NamedTuple):
    advantages: torch.Tensor
    returns: torch.Tensor
    kl_coef: float
    """The in-reward KL coefficient for the next step."""
    metrics: dict[str, float]


def step_advantages(
    scores: torch.Tensor,
    response_mask: torch.Tensor,
    uids: list,
    params: StepParams,
    kl_coef: float,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    baseline_scores: torch.Tensor | None = None,
    visual_dependency: torch.Tensor | None = None,
) -> StepAdvantages:
    """Advantages and returns `[B, T]` of a scored batch; the in-reward KL is subtracted first."""
    token_rewards = outcome_token_rewards(scores, response_mask)
    metrics: dict[str, float] = {}
    if params.kl_in_reward is not None:
        assert old_logprobs is not None and ref_logprobs is not None
        token_rewards, scores, mean_kl = kl_in_reward(
            token_rewards, scores, old_logprobs, ref_logprobs, response_mask, params.kl_in_reward, kl_coef
        )
        metrics = {"actor/reward_kl_penalty": mean_kl, "actor/reward_kl_penalty_coeff": kl_coef}
        if params.adaptive_kl is not None:
            target, horizon = params.adaptive_kl
            kl_coef = adaptive_kl_coef(kl_coef, mean_kl, target, horizon, len(scores))
    inputs = AdvantageInputs(
        token_rewards=token_rewards,
        scores=scores,
        groups=group_index(uids),
        response_mask=response_mask,
        values=values,
        baseline_scores=baseline_scores,
    )
    advantages, returns = compute_advantages(params.estimator, inputs, params.advantage)
    if params.shaping_min is not None:
        assert visual_dependency is not None
        scale = advantage_shaping_scale(visual_dependency, response_mask, params.shaping_min)
        advantages = advantages * scale[:, None]
        metrics |= {
            "vppo/advantage_scale/max": float(scale.max()),
            "vppo/advantage_scale/min": float(scale.min()),
        }
    return StepAdvantages(advantages, returns, kl_coef, metrics)


class VisualDependency(NamedTuple):
    dependency: torch.Tensor
    """`[B, T]`: each sampled token's dependency on the image."""
    perception_mask: torch.Tensor
    """1.0 on the top `top_p` share of each response's tokens by dependency."""
    metrics: dict[str, float]


def visual_dependency(
    old_logprobs: torch.Tensor,
    masked_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    clamp: float,
    top_p: float,
) -> VisualDependency:
    """VPPO: each sampled token's dependency on the image (k3 KL between the policy with the image and
    with a patch-masked image) and the perception tokens (the top `top_p` per response)."""
    dependency = token_visual_dependency(old_logprobs, masked_logprobs, response_mask, clamp)
    perception = perception_token_mask(dependency, response_mask, top_p).float()
    tokens = response_mask.sum().clamp(min=1)
    metrics = {
        "vppo/dependency/mean": float(dependency.sum() / tokens),
        "vppo/perception_token_fraction": float(perception.sum() / tokens),
    }
    return VisualDependency(dependency, perception, metrics)
