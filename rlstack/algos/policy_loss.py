"""Policy losses, their aggregation over tokens, and rollout/trainer mismatch correction.

Every loss is a per-token `[B, T]` tensor, zero outside `response_mask`, with
r = exp(logp - logp_old) the per-token ratio and A the advantage. The per-token log-ratio is
clamped to [-20, 20] before `exp` (as in veRL), so a stray token cannot overflow; beyond that bound
its gradient is zero. Values outside the mask never reach a sum: they are selected away
(`torch.where`), not multiplied by 0, so a NaN or infinite value on padding (a `-inf` reference
log-prob, a NaN entropy) leaves the loss and its gradient finite.

Losses (`PolicyLoss`, chosen from `POLICY_LOSSES`):

- `vanilla`: PPO clipped surrogate (Schulman et al., 2017, arXiv:1707.06347)
      max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))
  with separate lower and upper ranges (DAPO's clip-higher, Yu et al., 2025, arXiv:2503.14476) and
  dual clip (Ye et al., 2020, arXiv:1912.09729): for A < 0 the loss is also capped at -A c
  (`clip_ratio_dual` = c > 1), so a huge ratio on a bad token cannot blow the update up. Tokens on
  a clipped branch get no gradient. `ppo_clip_loss` is this loss without dual clip.
- `gspo`: GSPO (Zheng et al., 2025, arXiv:2507.18071). The ratio is the sequence's, normalised by
  length: s_i = exp(mean over its sampled tokens of (logp - logp_old)). It is written per token in
  the paper's stop-gradient form s_i,t = sg[s_i] * pi(y_t) / sg[pi(y_t)]: its value is s_i and its
  gradient with respect to logp_t is s_i. As in veRL's `compute_policy_loss_gspo`, the mean is
  taken over the raw per-token log-ratios (no per-token clamp) and log s_i,t is clamped from above
  at 10 before `exp` (`GSPO_LOG_RATIO_MAX`), so a sequence whose log-ratio passes 10 gets no
  gradient. The advantage is the sequence's, the mean of A over its sampled tokens, so with
  `seq-mean-token-mean` the per-token losses sum to the paper's sequence objective,
  max(-A_i s_i, -A_i clip(s_i)), and its gradient.
- `gspo_token`: GSPO-token from the same paper: the same s_i,t, but each token keeps its own
  advantage A_i,t (and its own clipping decision). This is what veRL calls `gspo` (its GSPO loss
  uses the per-token advantages). It equals `gspo` when A is constant over each sequence, as with
  outcome rewards.
- `cispo`: CISPO (MiniMax-M1, MiniMax, 2025, arXiv:2506.13585): -A sg(min(r, 1 + eps_high)) logp.
  The IS weight is truncated and detached, and every sampled token keeps a gradient. The paper
  writes clip(r, 1 - eps_low, 1 + eps_high) but sets eps_low large enough to never bind; this code
  drops the lower bound and ignores `clip_ratio_low` (veRL clamps at 1 - clip_ratio_low, and its
  CISPO example sets clip_ratio_low = 10 to disable it). The paper's masked "unified" variant is
  not implemented. The loss value is -A w logp, not comparable in size with the PPO losses.
- `sapo`: SAPO (Soft Adaptive Policy Optimization, 2025, arXiv:2511.20347) replaces the hard clip
  with a soft gate: loss = -A f(r), f(r) = sigmoid(tau (r - 1)) * 4 / tau, with tau = tau_pos for
  A > 0 and tau_neg otherwise (tau_neg > tau_pos makes negative-advantage gradients fade faster).
  Its gradient at r = 1 is that of -A r; it decays smoothly as r leaves 1 and is never zero. This
  follows veRL's `compute_policy_loss_sapo` and the ms-swift/AReaL descriptions; the paper was not
  read. SAPO clips nothing, so its `clipped_*` are zero.

GSPO, GSPO-token and SAPO are defined with `seq-mean-token-mean` aggregation (veRL hard-codes it
for GSPO and SAPO whatever `loss_agg_mode` says); the config picks it when
`worker.actor.loss_agg_mode` is not set and refuses another explicit choice.

Clip fractions (`PolicyLossOutput`): `clipped_high` / `clipped_low` mark the tokens where the
clipped branch of max(-A r, -A clip(r)) won, for A > 0 and A < 0; `clipped` is either (veRL's
`pg_clipfrac`). `clipped_dual` marks the tokens capped by dual clip (veRL's `pg_clipfrac_lower`,
which counts dual clip only).

Aggregation (`LossAggMode`) turns the `[B, T]` loss into the scalar of one micro-batch. Its
normalisers are the counts of the whole mini-batch, not of the micro-batch, so that the micro-batch
losses of one mini-batch sum to the loss of the mini-batch in one piece, and gradient accumulation
changes nothing:

- `token-mean`: sum over sampled tokens / the mini-batch's sampled-token count.
- `seq-mean-token-sum`: each sequence's token sum, averaged over the mini-batch's sequences.
- `seq-mean-token-mean`: each sequence's token mean, averaged over the mini-batch's sequences
  (GRPO, Shao et al., 2024, arXiv:2402.03300).
- `seq-mean-token-sum-norm`: the sum over the mini-batch's sequences of each sequence's token sum,
  divided by a constant `norm_length` (the maximum response length): Dr. GRPO (Liu et al., 2025,
  arXiv:2503.20783) as veRL's `agg_loss` computes it. Despite the name there is no mean over
  sequences: the value (and gradient) grows with the mini-batch size, as in veRL.
"Sequences" counts those with at least one sampled token; a sequence without any contributes zero.

Rollout correction (`RolloutCorrection`) weighs each token's loss by how far the trainer's
log-probs of the sampled tokens (`old_logprobs`, recomputed under the rollout weights) are from the
inference engine's (`rollout_logprobs`): rho_t = exp(old - rollout). The weight is detached and
zero outside the mask; multiply it into the per-token loss before aggregation.

- `tis`: truncated IS, min(rho_t, high) (Yao et al., 2025, "Your Efficient RL Framework Secretly
  Brings You Off-Policy RL Training"; veRL `rollout_is="token"` with a single threshold).
- `icepop`: rho_t where low <= rho_t <= high, else 0 (IcePop, Ling Team, 2025, arXiv:2510.18855,
  the M(k) of its objective; veRL `rollout_is="token"` with a "low_high" threshold).
- `seq-mask-tis`: the sequence ratio rho_i = exp(sum over its sampled tokens of log rho_t), broadcast
  to its tokens, where low <= rho_i <= high, else 0: out-of-band sequences are masked out, the
  rest weighted (veRL `rollout_is="sequence"` with a "low_high" threshold; "Seq-MIS" in Liu, Li et
  al., 2025, "When Speed Kills Stability", which masks above the upper bound only).
The log-ratios are clamped to [-20, 20] before `exp`, as in veRL.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from rlstack.config.actor import LossAggModeName, PolicyLossName, RolloutCorrectionName
from rlstack.config.fields import choice_enum

LOG_RATIO_BOUND = 20.0
GSPO_LOG_RATIO_MAX = 10.0


# ------------------------------------------------------------------------------------ policy losses


PolicyLoss = choice_enum("PolicyLoss", PolicyLossName, __name__)
"""`worker.actor.loss_type`'s choices: VANILLA, GSPO, GSPO_TOKEN, CISPO, SAPO."""


class PolicyLossParams(NamedTuple):
    clip_ratio_low: float = 0.2  # eps_low: vanilla, gspo, gspo_token
    clip_ratio_high: float = 0.28  # eps_high: vanilla, gspo, gspo_token; CISPO's IS-weight cap 1 + eps_high
    clip_ratio_dual: float = 3.0  # c > 1 of dual clip (vanilla); math.inf turns it off
    sapo_tau_pos: float = 1.0  # SAPO gate temperature for A > 0
    sapo_tau_neg: float = 1.05  # SAPO gate temperature for A <= 0


class PolicyLossOutput(NamedTuple):
    loss: torch.Tensor  # [B, T] per-token loss, zero outside the mask
    clipped_high: torch.Tensor  # [B, T] 1.0 where the clipped branch won for A > 0 (upper clip)
    clipped_low: torch.Tensor  # [B, T] 1.0 where the clipped branch won for A < 0 (lower clip)
    clipped_dual: torch.Tensor  # [B, T] 1.0 where dual clip capped the loss (A < 0, huge ratio)
    approx_kl: torch.Tensor  # [B, T] logp_old - logp (detached), zero outside the mask

    @property
    def clipped(self) -> torch.Tensor:
        """[B, T] 1.0 where the upper or lower clip was active (dual clip not included, as veRL)."""
        return torch.maximum(self.clipped_high, self.clipped_low)


def _log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """logp - logp_old on sampled tokens, 0 elsewhere, clamped to +-LOG_RATIO_BOUND. -> [B, T]"""
    return torch.where(mask, logprobs - old_logprobs, 0.0).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def _clipped_surrogate(
    ratio: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    clip_ratio_low: float,
    clip_ratio_high: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """max(-A r, -A clip(r)), and where the clipped branch won for A > 0 (high) and A < 0 (low)."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    took_clip = clipped > unclipped
    return torch.maximum(unclipped, clipped), took_clip & (advantages > 0), took_clip & (advantages < 0)


def _output(
    loss: torch.Tensor,  # [B, T]
    high: torch.Tensor,  # [B, T] bool
    low: torch.Tensor,  # [B, T] bool
    dual: torch.Tensor,  # [B, T] bool
    log_ratio: torch.Tensor,  # [B, T], zero outside the mask
    mask: torch.Tensor,  # [B, T] bool
) -> PolicyLossOutput:
    dtype = loss.dtype
    return PolicyLossOutput(
        torch.where(mask, loss, 0.0),
        (high & mask).to(dtype),
        (low & mask).to(dtype),
        (dual & mask).to(dtype),
        -log_ratio.detach(),
    )


def vanilla_loss(
    logprobs: torch.Tensor,  # [B, T]
    old_logprobs: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    params: PolicyLossParams,
) -> PolicyLossOutput:
    """PPO clip with asymmetric ranges and dual clip on negative advantages."""
    if not params.clip_ratio_dual > 1.0:
        raise ValueError(
            f"clip_ratio_dual must be > 1 (it caps -A r at -A c for A < 0), got {params.clip_ratio_dual}; "
            "use math.inf to turn dual clip off"
        )
    mask = response_mask > 0
    log_ratio = _log_ratio(logprobs, old_logprobs, mask)
    loss, high, low = _clipped_surrogate(
        torch.exp(log_ratio), advantages, params.clip_ratio_low, params.clip_ratio_high
    )
    negative = advantages < 0
    cap = torch.where(negative, -advantages * params.clip_ratio_dual, math.inf)  # [B, T]
    dual = negative & (loss > cap)
    return _output(torch.minimum(loss, cap), high, low, dual, log_ratio, mask)


def _gspo(
    logprobs: torch.Tensor,  # [B, T]
    old_logprobs: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T] per-token or per-sequence (broadcast) advantages
    mask: torch.Tensor,  # [B, T] bool
    params: PolicyLossParams,
) -> PolicyLossOutput:
    raw = torch.where(mask, logprobs - old_logprobs, 0.0)  # [B, T] unclamped, as veRL
    lengths = mask.sum(-1, keepdim=True).clamp(min=1)  # [B, 1]
    seq_log_ratio = (raw.sum(-1, keepdim=True) / lengths).detach()  # [B, 1] log s_i
    # value log s_i, gradient d/d logp_t = 1 below the cap: s_i,t = sg[s_i] * pi / sg[pi]
    token_log_ratio = (seq_log_ratio + logprobs - logprobs.detach()).clamp(max=GSPO_LOG_RATIO_MAX)
    token_log_ratio = torch.where(mask, token_log_ratio, 0.0)
    loss, high, low = _clipped_surrogate(
        torch.exp(token_log_ratio), advantages, params.clip_ratio_low, params.clip_ratio_high
    )
    no_dual = torch.zeros_like(mask)
    return _output(loss, high, low, no_dual, _log_ratio(logprobs, old_logprobs, mask), mask)


def gspo_loss(
    logprobs: torch.Tensor,  # [B, T]
    old_logprobs: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    params: PolicyLossParams,
) -> PolicyLossOutput:
    """GSPO: sequence ratio s_i and sequence advantage (mean of A over the sampled tokens)."""
    mask = response_mask > 0
    seq_adv = torch.where(mask, advantages, 0.0).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(
        min=1
    )  # [B, 1]
    return _gspo(logprobs, old_logprobs, seq_adv.expand_as(advantages), mask, params)


def gspo_token_loss(
    logprobs: torch.Tensor,  # [B, T]
    old_logprobs: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    params: PolicyLossParams,
) -> PolicyLossOutput:
    """GSPO-token: sequence ratio s_i, per-token advantages."""
    return _gspo(logprobs, old_logprobs, advantages, response_mask > 0, params)


def cispo_loss(
    logprobs: torch.Tensor,  # [B, T]
    old_logprobs: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    params: PolicyLossParams,
) -> PolicyLossOutput:
    """CISPO: -A sg(min(r, 1 + eps_high)) logp; clip_ratio_low is not used."""
    mask = response_mask > 0
    log_ratio = _log_ratio(logprobs, old_logprobs, mask)
    ratio = torch.exp(log_ratio).detach()
    cap = 1.0 + params.clip_ratio_high
    loss = -advantages * ratio.clamp(max=cap) * logprobs
    no_clip = torch.zeros_like(mask)
    return _output(loss, ratio > cap, no_clip, no_clip, log_ratio, mask)


def sapo_loss(
    logprobs: torch.Tensor,  # [B, T]
    old_logprobs: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    params: PolicyLossParams,
) -> PolicyLossOutput:
    """SAPO: -A sigmoid(tau (r - 1)) 4 / tau, tau = tau_pos for A > 0, else tau_neg."""
    mask = response_mask > 0
    log_ratio = _log_ratio(logprobs, old_logprobs, mask)
    ratio = torch.exp(log_ratio)
    tau = torch.full_like(ratio, params.sapo_tau_neg).masked_fill(advantages > 0, params.sapo_tau_pos)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    no_clip = torch.zeros_like(mask)
    return _output(-advantages * gate, no_clip, no_clip, no_clip, log_ratio, mask)


PolicyLossFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, PolicyLossParams], PolicyLossOutput
]

POLICY_LOSSES: dict[PolicyLoss, PolicyLossFn] = {
    PolicyLoss.VANILLA: vanilla_loss,
    PolicyLoss.GSPO: gspo_loss,
    PolicyLoss.GSPO_TOKEN: gspo_token_loss,
    PolicyLoss.CISPO: cispo_loss,
    PolicyLoss.SAPO: sapo_loss,
}


def policy_loss(
    kind: PolicyLoss,
    logprobs: torch.Tensor,  # [B, T]
    old_logprobs: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    params: PolicyLossParams,
) -> PolicyLossOutput:
    return POLICY_LOSSES[PolicyLoss(kind)](logprobs, old_logprobs, advantages, response_mask, params)


def ppo_clip_loss(
    logprobs: torch.Tensor,  # [B, T]
    old_logprobs: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    clip_ratio_low: float,
    clip_ratio_high: float,
) -> PolicyLossOutput:
    """`vanilla` without dual clip."""
    params = PolicyLossParams(clip_ratio_low, clip_ratio_high, clip_ratio_dual=math.inf)
    return vanilla_loss(logprobs, old_logprobs, advantages, response_mask, params)


# -------------------------------------------------------------------------------------- aggregation


LossAggMode = choice_enum("LossAggMode", LossAggModeName, __name__)
"""`worker.actor.loss_agg_mode`'s choices: TOKEN_MEAN, SEQ_MEAN_TOKEN_SUM, SEQ_MEAN_TOKEN_MEAN,
SEQ_MEAN_TOKEN_SUM_NORM."""


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is nonzero; other positions are selected away, so a NaN or inf
    there does not reach the sum (or its gradient)."""
    selected = torch.where(mask.bool(), values, 0.0)
    return selected.sum() if dim is None else selected.sum(dim)


def token_mean(
    values: torch.Tensor, mask: torch.Tensor, normalizer: float | torch.Tensor | None = None
) -> torch.Tensor:
    """Sum of `values` over masked tokens / `normalizer` (default: the masked token count). -> scalar"""
    total = masked_sum(values, mask)
    if normalizer is None:
        normalizer = mask.sum()
    return total / torch.as_tensor(normalizer, dtype=total.dtype).clamp(min=1)


class LossNormalizers(NamedTuple):
    """Counts of the whole mini-batch that each micro-batch's loss is divided by."""

    global_tokens: float | torch.Tensor  # sampled tokens in the whole mini-batch, `mask.sum()`
    global_seqs: float | torch.Tensor  # its sequences with a sampled token, `(mask.sum(-1) > 0).sum()`
    norm_length: float  # the constant of seq-mean-token-sum-norm, the maximum response length
    # what token-mean metrics divide by (the rows computed, `skip_zero_advantage`); None: global_tokens
    metric_tokens: float | torch.Tensor | None = None


def _seq_mean(per_seq: torch.Tensor, global_seqs: float | torch.Tensor) -> torch.Tensor:
    """Sum of `per_seq` [B] / the mini-batch's sequence count. -> scalar"""
    return per_seq.sum() / torch.as_tensor(global_seqs, dtype=per_seq.dtype).clamp(min=1)


def _agg_token_mean(loss: torch.Tensor, mask: torch.Tensor, n: LossNormalizers) -> torch.Tensor:
    return token_mean(loss, mask, n.global_tokens)


def _agg_seq_mean_token_sum(loss: torch.Tensor, mask: torch.Tensor, n: LossNormalizers) -> torch.Tensor:
    return _seq_mean(masked_sum(loss, mask, -1), n.global_seqs)


def _agg_seq_mean_token_mean(loss: torch.Tensor, mask: torch.Tensor, n: LossNormalizers) -> torch.Tensor:
    return _seq_mean(masked_sum(loss, mask, -1) / mask.sum(-1).clamp(min=1), n.global_seqs)


def _agg_seq_mean_token_sum_norm(loss: torch.Tensor, mask: torch.Tensor, n: LossNormalizers) -> torch.Tensor:
    return masked_sum(loss, mask) / n.norm_length  # veRL: no mean over sequences


AGGREGATORS: dict[LossAggMode, Callable[[torch.Tensor, torch.Tensor, LossNormalizers], torch.Tensor]] = {
    LossAggMode.TOKEN_MEAN: _agg_token_mean,
    LossAggMode.SEQ_MEAN_TOKEN_SUM: _agg_seq_mean_token_sum,
    LossAggMode.SEQ_MEAN_TOKEN_MEAN: _agg_seq_mean_token_mean,
    LossAggMode.SEQ_MEAN_TOKEN_SUM_NORM: _agg_seq_mean_token_sum_norm,
}


def aggregate_loss(
    loss: torch.Tensor,  # [B, T] per-token loss of one micro-batch
    mask: torch.Tensor,  # [B, T] response mask of that micro-batch
    mode: LossAggMode,
    global_tokens: float | torch.Tensor,
    global_seqs: float | torch.Tensor,
    norm_length: float,
) -> torch.Tensor:
    """The micro-batch's share of the mini-batch loss. -> scalar

    `global_tokens`: sampled tokens in the whole mini-batch, `mask.sum()` over it.
    `global_seqs`: its sequences with at least one sampled token, `(mask.sum(-1) > 0).sum()`.
    `norm_length`: the constant of `seq-mean-token-sum-norm`, e.g. the maximum response length.
    """
    if not norm_length > 0:
        raise ValueError(f"norm_length must be > 0 (e.g. the maximum response length), got {norm_length}")
    mask = mask.to(loss.dtype)
    return AGGREGATORS[LossAggMode(mode)](
        loss, mask, LossNormalizers(global_tokens, global_seqs, norm_length)
    )


# ------------------------------------------------------------------------------- rollout correction


RolloutCorrection = choice_enum("RolloutCorrection", RolloutCorrectionName, __name__)
"""`worker.actor.rollout_correction`'s choices: TIS, ICEPOP, SEQ_MASK_TIS."""


class RolloutCorrectionParams(NamedTuple):
    low: float = 0.5  # icepop, seq-mask-tis: lower bound of the kept band
    high: float = 2.0  # tis: the cap; icepop, seq-mask-tis: upper bound of the kept band


def _band(weight: torch.Tensor, params: RolloutCorrectionParams) -> torch.Tensor:
    """`weight` where low <= weight <= high, else 0."""
    return torch.where((weight >= params.low) & (weight <= params.high), weight, 0.0)


def tis_weight(
    old_logprobs: torch.Tensor,  # [B, T] trainer log-probs of the sampled tokens
    rollout_logprobs: torch.Tensor,  # [B, T] inference-engine log-probs of the same tokens
    response_mask: torch.Tensor,  # [B, T]
    params: RolloutCorrectionParams,
) -> torch.Tensor:
    """min(exp(old - rollout), high) per token. -> [B, T], detached"""
    log_rho = _log_ratio(old_logprobs, rollout_logprobs, response_mask > 0).detach()
    return torch.exp(log_rho).clamp(max=params.high) * (response_mask > 0)


def icepop_weight(
    old_logprobs: torch.Tensor,  # [B, T]
    rollout_logprobs: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    params: RolloutCorrectionParams,
) -> torch.Tensor:
    """exp(old - rollout) per token, zeroed outside [low, high]. -> [B, T], detached"""
    log_rho = _log_ratio(old_logprobs, rollout_logprobs, response_mask > 0).detach()
    return _band(torch.exp(log_rho), params) * (response_mask > 0)


def seq_mask_tis_weight(
    old_logprobs: torch.Tensor,  # [B, T]
    rollout_logprobs: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    params: RolloutCorrectionParams,
) -> torch.Tensor:
    """The sequence's exp(sum(old - rollout)) on its tokens, zeroed outside [low, high]. -> [B, T], detached"""
    mask = response_mask > 0
    log_rho = torch.where(mask, old_logprobs - rollout_logprobs, 0.0).detach()
    seq_log_rho = log_rho.sum(-1, keepdim=True).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # [B, 1]
    return _band(torch.exp(seq_log_rho), params) * mask


ROLLOUT_CORRECTIONS: dict[
    RolloutCorrection,
    Callable[[torch.Tensor, torch.Tensor, torch.Tensor, RolloutCorrectionParams], torch.Tensor],
] = {
    RolloutCorrection.TIS: tis_weight,
    RolloutCorrection.ICEPOP: icepop_weight,
    RolloutCorrection.SEQ_MASK_TIS: seq_mask_tis_weight,
}


def rollout_correction(
    kind: RolloutCorrection,
    old_logprobs: torch.Tensor,  # [B, T]
    rollout_logprobs: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    params: RolloutCorrectionParams,
) -> torch.Tensor:
    """Detached [B, T] weight to multiply into the per-token policy loss; zero outside the mask."""
    if not 0 <= params.low <= params.high:
        raise ValueError(
            f"rollout correction bounds need 0 <= low <= high, got low={params.low}, high={params.high}"
        )
    return ROLLOUT_CORRECTIONS[RolloutCorrection(kind)](old_logprobs, rollout_logprobs, response_mask, params)
