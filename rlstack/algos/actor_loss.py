"""The actor's loss for one micro-batch: the policy loss and every term and mask around it.

`actor_loss(inputs, params, normalizers)` assembles, in this order:

1. the policy loss `params.loss_type` per token (`policy_loss.py`);
2. times the rollout-correction weight, when `params.rollout_correction` is set (needs
   `inputs.rollout_logprobs`);
3. times the high-entropy token mask, when `params.top_entropy_quantile` < 1 (Wang et al., 2025;
   the quantile is taken over the micro-batch's sampled tokens, `entropy.py`);
4. times VPPO's token mask: the perception mask, when `params.vppo_perception` (needs
   `inputs.perception_mask`), or each response's `params.vppo_entropy_top_p` highest-entropy tokens,
   or with both either (VPPO's `use_vppo_on_entropy` OR'd with `use_vppo_on_perception`);
5. aggregated with `params.agg_mode` over the mini-batch's counts (`normalizers`): `actor/pg_loss`;
6. plus VPPO's entropy penalty, when `params.vppo_entropy_penalty_coef` is set;
7. minus `entropy_coeff` times the aggregated entropy (the entropy bonus);
8. plus `kl_coef` times the aggregated KL to the reference, when `params.kl_penalty` is set: a
   sampled-token estimator of `inputs.ref_logprobs`, or `full`, the exact KL the caller computed
   from both models' logits (`inputs.exact_kl`).

Every term uses the same aggregation, so the micro-batch losses of a mini-batch sum to its loss.
An input a setting needs and that is missing is an error naming both; an input no setting uses is
ignored. The reference log-probs are read only on sampled tokens, so a `-inf` on padding cannot
reach the loss or its gradient.

Metrics are summed over the micro-batches of a mini-batch by the caller; each is this
micro-batch's share, a token mean over the mini-batch's sampled tokens (`normalizers.metric_tokens`
where only some rows are computed) or an aggregated loss:
`actor/pg_loss`, `actor/pg_clipfrac`, `actor/pg_clipfrac_higher`, `actor/pg_clipfrac_lower` (dual
clip, as veRL), `actor/ppo_kl`, `actor/entropy`, and when on `actor/rollout_correction_weight`,
`actor/vppo_entropy_penalty`, `actor/kl_loss` (docs/metrics.md describes each).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rlstack.algos.entropy import high_entropy_mask, top_fraction_mask
from rlstack.algos.kl import KLPenalty, kl_penalty
from rlstack.algos.policy_loss import (
    LossAggMode,
    LossNormalizers,
    PolicyLoss,
    PolicyLossParams,
    RolloutCorrection,
    RolloutCorrectionParams,
    aggregate_loss,
    policy_loss,
    rollout_correction,
    token_mean,
)
from rlstack.algos.vppo import entropy_penalty


class ActorLossInputs(NamedTuple):
    logprobs: torch.Tensor  # [B, T] current policy's log-probs of the sampled tokens, with gradient
    entropy: torch.Tensor  # [B, T] current policy's entropy (with gradient when entropy_coeff != 0)
    old_logprobs: torch.Tensor  # [B, T] behaviour policy's log-probs (the trainer's, before the update)
    advantages: torch.Tensor  # [B, T]
    response_mask: torch.Tensor  # [B, T] 1 on sampled tokens only
    rollout_logprobs: torch.Tensor | None = None  # [B, T] inference engine's log-probs (rollout correction)
    perception_mask: torch.Tensor | None = None  # [B, T] VPPO: tokens that may get a policy gradient
    ref_logprobs: torch.Tensor | None = None  # [B, T] reference log-probs (sampled-token KL estimators)
    exact_kl: torch.Tensor | None = None  # [B, T] exact KL to the reference, with gradient (kl_penalty=full)


class ActorLossParams(NamedTuple):
    loss_type: PolicyLoss = PolicyLoss.VANILLA
    agg_mode: LossAggMode = LossAggMode.TOKEN_MEAN
    policy: PolicyLossParams = PolicyLossParams()
    rollout_correction: RolloutCorrection | None = None
    rollout_correction_params: RolloutCorrectionParams = RolloutCorrectionParams()
    top_entropy_quantile: float = 1.0  # < 1: train only on the highest-entropy tokens
    vppo_perception: bool = False  # multiply the policy loss by `perception_mask`
    vppo_entropy_top_p: float | None = None  # per response, only the top ceil(p * n) tokens by entropy
    vppo_entropy_penalty_coef: float | None = None  # None: no VPPO entropy penalty
    entropy_coeff: float = 0.0  # entropy bonus weight
    kl_penalty: KLPenalty | None = None  # None: no KL loss
    kl_coef: float = 0.0


class ActorLossOutput(NamedTuple):
    loss: torch.Tensor  # scalar, this micro-batch's share of the mini-batch loss
    metrics: dict[str, torch.Tensor]  # detached scalars, this micro-batch's share


def _required(value: torch.Tensor | None, name: str, setting: str) -> torch.Tensor:
    if value is None:
        raise ValueError(f"actor_loss: {setting} needs ActorLossInputs.{name}, which was not given")
    return value


def actor_loss(
    inputs: ActorLossInputs, params: ActorLossParams, normalizers: LossNormalizers
) -> ActorLossOutput:
    """The actor's loss of one micro-batch and its metrics (see the module docstring for the terms)."""
    logp, mask = inputs.logprobs, inputs.response_mask.float()  # [B, T]
    n = normalizers
    tokens = n.global_tokens if n.metric_tokens is None else n.metric_tokens  # of the metrics

    def agg(x: torch.Tensor) -> torch.Tensor:
        return aggregate_loss(x, mask, params.agg_mode, n.global_tokens, n.global_seqs, n.norm_length)

    out = policy_loss(params.loss_type, logp, inputs.old_logprobs, inputs.advantages, mask, params.policy)
    token_loss = out.loss  # [B, T]
    metrics: dict[str, torch.Tensor] = {}
    if params.rollout_correction is not None:
        rollout_logp = _required(inputs.rollout_logprobs, "rollout_logprobs", "rollout_correction")
        weight = rollout_correction(
            params.rollout_correction,
            inputs.old_logprobs,
            rollout_logp,
            mask,
            params.rollout_correction_params,
        )
        token_loss = token_loss * weight
        metrics["actor/rollout_correction_weight"] = token_mean(weight, mask, tokens)
    if params.top_entropy_quantile < 1.0:
        token_loss = token_loss * high_entropy_mask(
            inputs.entropy.detach(), mask, params.top_entropy_quantile
        )
    keep = None  # VPPO's token mask
    if params.vppo_entropy_top_p is not None:
        keep = top_fraction_mask(inputs.entropy.detach(), mask, params.vppo_entropy_top_p).float()
    if params.vppo_perception:
        perception = _required(inputs.perception_mask, "perception_mask", "vppo_perception")
        keep = perception if keep is None else torch.maximum(keep, perception)
    if keep is not None:
        token_loss = token_loss * keep
    pg_loss = agg(token_loss)
    loss = pg_loss
    if params.vppo_entropy_penalty_coef is not None:
        penalty = agg(entropy_penalty(logp, mask, params.vppo_entropy_penalty_coef))
        loss = loss + penalty
        metrics["actor/vppo_entropy_penalty"] = penalty.detach()
    metrics |= {
        "actor/pg_loss": pg_loss.detach(),
        "actor/pg_clipfrac": token_mean(out.clipped, mask, tokens),
        "actor/pg_clipfrac_higher": token_mean(out.clipped_high, mask, tokens),
        "actor/pg_clipfrac_lower": token_mean(out.clipped_dual, mask, tokens),
        "actor/ppo_kl": token_mean(out.approx_kl, mask, tokens),
        "actor/entropy": token_mean(inputs.entropy.detach(), mask, tokens),
    }
    if params.entropy_coeff:
        loss = loss - params.entropy_coeff * agg(inputs.entropy)
    if params.kl_penalty is not None:
        if params.kl_penalty == KLPenalty.FULL:
            per_token = _required(inputs.exact_kl, "exact_kl", "kl_penalty=full")
        else:
            ref = _required(inputs.ref_logprobs, "ref_logprobs", f"kl_penalty={params.kl_penalty.value}")
            # off the sampled tokens the reference may be anything (-inf on padding): read it only on them
            per_token = kl_penalty(params.kl_penalty, logp, torch.where(mask.bool(), ref, logp.detach()))
        kl_loss = agg(per_token)
        loss = loss + params.kl_coef * kl_loss
        metrics["actor/kl_loss"] = kl_loss.detach()
    return ActorLossOutput(loss, metrics)
