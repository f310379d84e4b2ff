"""Advantage estimators: pure functions from rewards to token-level advantages and returns.

Every estimator takes `(AdvantageInputs, AdvantageParams)` and returns `(advantages, returns)`,
both `[B, T]` over the full row (prompt + response columns) and exactly zero wherever
`response_mask` is 0: prompt, padding, and tool-observation tokens that may sit between sampled
tokens. `ADVANTAGE_ESTIMATORS` maps each `AdvEstimator` to its function; `compute_advantages`
dispatches. Advantages are constants of the policy update: every estimator runs under
`torch.no_grad()`, so no output carries a gradient whatever the inputs require. "Singleton" is a
group with one response (no other sample of the same prompt); group-relative estimators give it
0 instead of NaN or an error. The outcome estimators (all but `gae` and `reinforce_plus_plus`)
read `scores` and return the advantages tensor itself as `returns`; with in-reward KL the caller
passes scores already penalised by each row's summed KL (`kl.kl_in_reward`), which is veRL's sum
of the token-level rewards, so the KL reaches every estimator.

`gae`: Generalized Advantage Estimation (Schulman et al., 2016, arXiv:1506.02438) as used by PPO
for language models (Ouyang et al., 2022, arXiv:2203.02155), with the per-token rewards and critic
values: delta_t = r_t + gamma V_next - V_t, A_t = delta_t + gamma lam A_next, where "next" is the
next *sampled* token of the row, so an observation gap is skipped as if it were not there (the
recursion carries over it, as veRL's `compute_gae_advantage_return` and EasyR1), and V after the
last sampled token is 0 (the episode ends). returns = A + V before whitening; the advantages are
then whitened over the batch's sampled tokens. Departures: the whitening divides by (std + eps)
with the unbiased std and eps = 1e-6, where veRL's `masked_whiten` multiplies by rsqrt(var + 1e-8)
(a relative difference of about 1e-6 / std, larger for a near-constant batch); veRL leaves the carried values in masked columns, here they are 0.

`grpo`: GRPO (Shao et al., 2024, "DeepSeekMath", arXiv:2402.03300): A_i = (r_i - mean(r)) /
(std(r) + eps) over the responses to the same prompt, given to every sampled token. With
`norm_adv_by_std_in_grpo=False` the division is dropped, as in Dr. GRPO (Liu et al., 2025,
arXiv:2503.20783). Departures: `std` is the unbiased sample standard deviation (as veRL); a
singleton gets 0 (veRL gives it its raw score); a group whose scores are all equal gets exactly 0
(`groups.group_stats`; veRL's float mean can miss equal scores such as 0.6 by a last bit, and its
advantages are then ~0.06 from rounding alone).

`rloo`: REINFORCE Leave-One-Out (Kool et al., 2019, "Buy 4 REINFORCE samples, get a baseline for
free!"; Ahmadian et al., 2024, arXiv:2402.14740): A_i = r_i - mean of the other responses to the
same prompt (veRL writes it as n / (n - 1) (r_i - mean)). Departure: a singleton gets 0 (veRL
gives it its raw score, EasyR1 raises).

`reinforce_plus_plus`: REINFORCE++ (Hu, 2025, arXiv:2501.03262): the discounted return-to-go of
`token_rewards` over the row's sampled tokens, G_t = r_t + gamma G_next, whitened over the
batch's sampled tokens; `returns` is G before whitening (as veRL). Departures: veRL resets the
running return at every masked column, which would cut the return at a tool observation; here
the return carries over observation gaps (the discount counts sampled tokens only). The whitening
divides by (unbiased std + 1e-6), where veRL's `masked_whiten` multiplies by rsqrt(var + 1e-8), the
same epsilon difference as in `gae`. Groups are not used.

`reinforce_plus_plus_baseline`: REINFORCE++ with a group baseline (same paper, as veRL):
A_i = r_i - mean(r) over the prompt's responses, broadcast to its sampled tokens, then whitened
over the batch's sampled tokens (token-weighted, as veRL). Departures: singleton rows get 0 and
are left out of the whitening statistics (veRL keeps their raw score and whitens it); the whitening
divides by (unbiased std + 1e-6) where veRL multiplies by rsqrt(var + 1e-8), as in `gae`.

`remax`: ReMax (Li et al., 2024, arXiv:2310.10505): A_i = r_i - r(greedy response to the same
prompt), given to every sampled token; the caller generates and scores the greedy response
(`baseline_scores`). The score is the row's total reward (with in-reward KL, already penalised by
the caller, as EasyR1's sum of the token rewards). Departure: veRL uses the return-to-go of the
token rewards, so its advantage varies along the response; `returns` are the advantages, where
both return the reward-to-go. Groups are not used.

`grpo_passk`: GRPO for pass@k with k = n (Tang et al., 2025, "Optimizing Language Models for
Inference Time Objectives using Reinforcement Learning", arXiv:2503.19595), as veRL's
`compute_grpo_passk_outcome_advantage` (checked at volcengine/verl b178a3c) and EasyR1: in each
group only the best response gets a nonzero advantage, r_max - r_second_max, divided by
(unbiased group std + eps) when `norm_adv_by_std_in_grpo` (EasyR1 always divides). If several
responses share the best score the difference is 0, so the choice among them (here the lowest row)
does not matter. Departure: a singleton gets 0 (veRL and EasyR1 raise).

`loo_std`: NeMo RL's GRPO with `use_leave_one_out_baseline=True, normalize_rewards=True`
(`calculate_baseline_and_std_per_prompt` in nemo_rl/algorithms/utils.py and
`GRPOAdvantageEstimator` in nemo_rl/algorithms/advantage_estimator.py, checked at
NVIDIA-NeMo/RL 7ea279a): with b_i the mean and s_i the unbiased sample std (n - 2 in the
denominator) of the n - 1 *other* responses to the same prompt, A_i = (r_i - b_i) / (s_i + eps)
where s_i > 0 and A_i = r_i - b_i where s_i = 0 (which is always the case for groups of 2);
a singleton gets 0 (NeMo sets its baseline to its reward, same result). Departure: NeMo computes
s_i as sqrt(E[r^2] - E[r]^2), which can leave float residue when the others are all equal and
then divides by ~eps; here s_i is exactly 0 whenever the other responses are all equal.
`norm_adv_by_std_in_grpo` is not read; `rloo` is the same baseline without the division.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from rlstack.algos.groups import group_stats
from rlstack.config.algorithm import AdvEstimatorName
from rlstack.config.fields import choice_enum

AdvEstimator = choice_enum("AdvEstimator", AdvEstimatorName, __name__)
"""`algorithm.adv_estimator`'s choices: GAE, GRPO, RLOO, REINFORCE_PLUS_PLUS, REINFORCE_PLUS_PLUS_BASELINE,
REMAX, GRPO_PASSK, LOO_STD."""


class AdvantageInputs(NamedTuple):
    token_rewards: torch.Tensor  # [B, T] score at the last sampled token (minus in-reward KL), else 0
    scores: torch.Tensor  # [B] outcome score per row (minus its summed in-reward KL: `kl.kl_in_reward`)
    groups: torch.Tensor  # [B] long, dense group ids (`group_index`)
    response_mask: torch.Tensor  # [B, T] 1 on sampled tokens only
    values: torch.Tensor | None = None  # [B, T] critic values (gae only)
    baseline_scores: torch.Tensor | None = None  # [B] score of the greedy response (remax only)


class AdvantageParams(NamedTuple):
    gamma: float = 1.0
    """Discount per sampled token (gae, reinforce_plus_plus)."""
    lam: float = 1.0
    """GAE lambda (gae)."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide by the group's std (grpo, grpo_passk); False gives Dr. GRPO."""
    eps: float = 1e-6
    """Added to every std before dividing by it."""


AdvantageFn = Callable[[AdvantageInputs, AdvantageParams], tuple[torch.Tensor, torch.Tensor]]


def outcome_token_rewards(
    scores: torch.Tensor,  # [B]
    response_mask: torch.Tensor,  # [B, T]
) -> torch.Tensor:  # [B, T]
    """Each row's score at its last sampled token, 0 elsewhere (and everywhere in a row with none)."""
    sampled = response_mask.bool()
    last = sampled.shape[1] - 1 - sampled.flip(1).int().argmax(1)  # [B] column of the last sampled token
    rewards = scores.new_zeros(sampled.shape)
    rewards[torch.arange(len(scores), device=scores.device), last] = scores
    return rewards * sampled


# ---------------------------------------------------------------------------------------- helpers


def _leave_one_out_stats(
    scores: torch.Tensor,  # [B]
    groups: torch.Tensor,  # [B] long
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # count, mean, unbiased std of the others: [B]
    """Statistics of the other responses to each row's prompt; std is exactly 0 if they are all equal."""
    count, _, _ = group_stats(scores, groups)
    order = torch.argsort(groups, stable=True)  # [B] rows sorted by group
    start = torch.cumsum(count, 0).long() - count.long()  # [G] first sorted position of each group
    slot = torch.empty_like(groups)
    slot[order] = torch.arange(len(groups), device=groups.device) - start[groups[order]]  # [B]
    table = scores.new_zeros(len(count), int(count.max()))  # [G, N] each group's scores, left-aligned
    filled = torch.zeros(table.shape, dtype=torch.bool, device=table.device)  # [G, N]
    table[groups, slot] = scores
    filled[groups, slot] = True

    others = filled[groups]  # [B, N] the row's group without the row itself
    others[torch.arange(len(groups), device=groups.device), slot] = False
    vals = table[groups]  # [B, N]
    n = others.sum(1).to(scores.dtype)  # [B]
    mean = (vals * others).sum(1) / n.clamp(min=1)  # [B]
    var = (((vals - mean[:, None]) ** 2) * others).sum(1) / (n - 1).clamp(min=1)  # [B]
    lo = torch.where(others, vals, torch.inf).amin(1)  # [B]
    hi = torch.where(others, vals, -torch.inf).amax(1)  # [B]
    std = torch.where((n > 1) & (lo < hi), var.sqrt(), torch.zeros_like(var))
    mean = torch.where(lo == hi, lo, mean)  # equal others: exactly their value (a float sum can miss it)
    return n, mean, std


def _masked_whiten(
    x: torch.Tensor,  # [B, T]
    mask: torch.Tensor,  # [B, T] 0/1, same dtype as x
    eps: float,
) -> torch.Tensor:  # [B, T]
    """(x - mean) / (unbiased std + eps) over the masked entries; 0 outside the mask and if std = 0."""
    n = mask.sum()
    mean = (x * mask).sum() / n.clamp(min=1)
    std = ((((x - mean) ** 2) * mask).sum() / (n - 1).clamp(min=1)).sqrt()
    scale = torch.where(std > 0, 1 / (std + eps), torch.zeros_like(std))
    return (x - mean) * scale * mask


def _next_sampled(
    x: torch.Tensor,  # [B, T]
    sampled: torch.Tensor,  # [B, T] bool
) -> torch.Tensor:  # [B, T]
    """x at the next sampled column strictly after t in the same row, 0 if there is none."""
    B, T = sampled.shape
    col = torch.arange(T, device=x.device).expand(B, T)
    nearest = torch.where(sampled, col, T).flip(1).cummin(1).values.flip(1)  # [B, T] first sampled >= t
    after = torch.cat([nearest[:, 1:], nearest.new_full((B, 1), T)], dim=1)  # [B, T] first sampled > t
    return torch.cat([x, x.new_zeros(B, 1)], dim=1).gather(1, after)


def _discounted_cumsum(
    x: torch.Tensor,  # [B, T]
    sampled: torch.Tensor,  # [B, T] bool
    discount: float,
) -> torch.Tensor:  # [B, T]
    """y_t = x_t + discount * y_(next sampled token) on sampled tokens, 0 elsewhere."""
    y = torch.zeros_like(x)
    running = x.new_zeros(x.shape[0])  # [B]
    cols = sampled.any(0).nonzero().flatten()
    if len(cols):
        for t in range(int(cols[-1]), int(cols[0]) - 1, -1):
            running = torch.where(sampled[:, t], x[:, t] + discount * running, running)
            y[:, t] = running
    return y * sampled


def _broadcast(
    adv: torch.Tensor,  # [B]
    response_mask: torch.Tensor,  # [B, T]
) -> tuple[torch.Tensor, torch.Tensor]:  # advantages, returns: [B, T]
    out = adv[:, None] * response_mask.to(adv.dtype)
    return out, out


# ------------------------------------------------------------------------------------ estimators


def grpo_advantages(
    scores: torch.Tensor,  # [B]
    groups: torch.Tensor,  # [B] long, dense group ids
    response_mask: torch.Tensor,  # [B, T]
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:  # [B, T]
    count, mean, std = group_stats(scores, groups)
    adv = scores - mean[groups]  # [B]
    if norm_by_std:
        adv = adv / (std[groups] + eps)
    adv = torch.where(count[groups] > 1, adv, torch.zeros_like(adv))
    return adv[:, None] * response_mask.to(adv.dtype)


@torch.no_grad()
def gae(inputs: AdvantageInputs, params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    if inputs.values is None:
        raise ValueError(
            "the 'gae' advantage estimator needs critic values: pass AdvantageInputs(values=...) "
            "with the critic's [B, T] values, or choose an estimator without a critic (e.g. 'grpo')"
        )
    rewards, values = inputs.token_rewards, inputs.values  # [B, T]
    sampled = inputs.response_mask.bool()  # [B, T]
    mask = sampled.to(rewards.dtype)
    delta = rewards + params.gamma * _next_sampled(values, sampled) - values  # [B, T]
    adv = _discounted_cumsum(delta, sampled, params.gamma * params.lam)  # [B, T]
    returns = (adv + values) * mask
    return _masked_whiten(adv, mask, params.eps), returns


@torch.no_grad()
def grpo(inputs: AdvantageInputs, params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    adv = grpo_advantages(
        inputs.scores, inputs.groups, inputs.response_mask, params.norm_adv_by_std_in_grpo, params.eps
    )
    return adv, adv


@torch.no_grad()
def rloo(inputs: AdvantageInputs, params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    n_others, mean_others, _ = _leave_one_out_stats(inputs.scores, inputs.groups)  # [B] each
    adv = torch.where(n_others > 0, inputs.scores - mean_others, torch.zeros_like(mean_others))
    return _broadcast(adv, inputs.response_mask)


@torch.no_grad()
def reinforce_plus_plus(
    inputs: AdvantageInputs, params: AdvantageParams
) -> tuple[torch.Tensor, torch.Tensor]:
    sampled = inputs.response_mask.bool()  # [B, T]
    returns = _discounted_cumsum(inputs.token_rewards, sampled, params.gamma)  # [B, T]
    return _masked_whiten(returns, sampled.to(returns.dtype), params.eps), returns


@torch.no_grad()
def reinforce_plus_plus_baseline(
    inputs: AdvantageInputs, params: AdvantageParams
) -> tuple[torch.Tensor, torch.Tensor]:
    count, mean, _ = group_stats(inputs.scores, inputs.groups)  # [G] each
    has_group = count[inputs.groups] > 1  # [B]
    centred = torch.where(has_group, inputs.scores - mean[inputs.groups], torch.zeros_like(inputs.scores))
    mask = inputs.response_mask.to(centred.dtype) * has_group[:, None]  # [B, T]
    adv = _masked_whiten(centred[:, None].expand(mask.shape), mask, params.eps)
    return adv, adv


@torch.no_grad()
def remax(inputs: AdvantageInputs, params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    if inputs.baseline_scores is None:
        raise ValueError(
            "the 'remax' advantage estimator needs the score of a greedy response to each prompt: "
            "pass AdvantageInputs(baseline_scores=...) as a [B] tensor aligned with `scores`"
        )
    return _broadcast(inputs.scores - inputs.baseline_scores, inputs.response_mask)


@torch.no_grad()
def grpo_passk(inputs: AdvantageInputs, params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    scores, groups = inputs.scores, inputs.groups  # [B]
    count, _, std = group_stats(scores, groups)  # [G] each
    rows = torch.arange(len(scores), device=scores.device)
    best = torch.full_like(count, -torch.inf).scatter_reduce(0, groups, scores, "amax")  # [G]
    first_best = torch.where(scores == best[groups], rows, len(scores))  # [B]
    best_row = torch.full_like(groups, len(scores)).scatter_reduce(0, groups, first_best, "amin")  # [G]
    is_best = rows == best_row[groups]  # [B] one row per group
    rest = torch.where(is_best, -torch.inf, scores)
    second = torch.full_like(count, -torch.inf).scatter_reduce(0, groups, rest, "amax")  # [G]
    gap = torch.where(count > 1, best - second, torch.zeros_like(best))  # [G]
    if params.norm_adv_by_std_in_grpo:  # std = 0 only when every score ties, and then gap = 0
        gap = torch.where(std > 0, gap / (std + params.eps), gap)
    adv = torch.where(is_best, gap[groups], torch.zeros_like(scores))  # [B]
    return _broadcast(adv, inputs.response_mask)


@torch.no_grad()
def loo_std(inputs: AdvantageInputs, params: AdvantageParams) -> tuple[torch.Tensor, torch.Tensor]:
    n_others, mean_others, std_others = _leave_one_out_stats(inputs.scores, inputs.groups)  # [B] each
    adv = torch.where(n_others > 0, inputs.scores - mean_others, torch.zeros_like(mean_others))
    adv = torch.where(std_others > 0, adv / (std_others + params.eps), adv)
    return _broadcast(adv, inputs.response_mask)


ADVANTAGE_ESTIMATORS: dict[AdvEstimator, AdvantageFn] = {
    AdvEstimator.GAE: gae,
    AdvEstimator.GRPO: grpo,
    AdvEstimator.RLOO: rloo,
    AdvEstimator.REINFORCE_PLUS_PLUS: reinforce_plus_plus,
    AdvEstimator.REINFORCE_PLUS_PLUS_BASELINE: reinforce_plus_plus_baseline,
    AdvEstimator.REMAX: remax,
    AdvEstimator.GRPO_PASSK: grpo_passk,
    AdvEstimator.LOO_STD: loo_std,
}


def compute_advantages(
    estimator: AdvEstimator | str, inputs: AdvantageInputs, params: AdvantageParams
) -> tuple[torch.Tensor, torch.Tensor]:  # advantages, returns: [B, T], 0 outside response_mask
    return ADVANTAGE_ESTIMATORS[AdvEstimator(estimator)](inputs, params)
