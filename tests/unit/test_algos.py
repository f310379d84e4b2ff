"""Advantages, the PPO-clip loss, token-mean aggregation and the k3 KL against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from rlstack.algos.advantages import ADVANTAGE_ESTIMATORS, AdvEstimator, grpo_advantages
from rlstack.algos.groups import group_index
from rlstack.algos.kl import KL_ESTIMATORS, KLPenalty, low_var_kl
from rlstack.algos.policy_loss import ppo_clip_loss, token_mean

CLIP_LOW, CLIP_HIGH = 0.2, 0.28


def close(actual: torch.Tensor, expected: list, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# ------------------------------------------------------------------------------------- advantages


def test_group_index_in_order_of_first_appearance():
    assert group_index(["b", "a", "b", "c", "a"]).tolist() == [0, 1, 0, 2, 1]
    assert group_index(["x"]).dtype == torch.long


def test_grpo_two_groups_normalised_by_std():
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 1]])
    adv = grpo_advantages(scores, groups, mask)
    # group 0: mean 0.5, unbiased std sqrt(0.5) = 0.707107 -> +-0.5 / 0.707107 = +-0.707106
    # group 1: every score equal -> 0
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    close(adv, [[a, a, 0.0], [-a, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert abs(a - 0.707106) < 1e-6


def test_grpo_without_std_normalisation():
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1])
    mask = torch.ones(4, 2)
    adv = grpo_advantages(scores, groups, mask, norm_by_std=False)
    close(adv, [[0.5, 0.5], [-0.5, -0.5], [0.0, 0.0], [0.0, 0.0]])


def test_grpo_group_of_three_interleaved_rows():
    # group 0 = rows 0, 2, 4 with scores 2, 0, 1: mean 1, unbiased std sqrt((1 + 1 + 0) / 2) = 1
    # group 1 = rows 1, 3 with scores 3, 1: mean 2, std sqrt(2) -> +-1 / 1.414214 = +-0.707107
    scores = torch.tensor([2.0, 3.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 1, 0, 1, 0])
    adv = grpo_advantages(scores, groups, torch.ones(5, 1), eps=0.0)
    close(adv, [[1.0], [0.707107], [-1.0], [-0.707107], [0.0]])
    adv = grpo_advantages(scores, groups, torch.ones(5, 1), norm_by_std=False)
    close(adv, [[1.0], [1.0], [-1.0], [-1.0], [0.0]])


def test_grpo_singleton_group_gets_zero_not_nan():
    scores = torch.tensor([1.0, 0.0, 5.0])
    groups = torch.tensor([0, 0, 1])
    for norm in (True, False):
        adv = grpo_advantages(scores, groups, torch.ones(3, 2), norm_by_std=norm)
        assert torch.isfinite(adv).all()
        assert adv[2].tolist() == [0.0, 0.0]
        assert adv[0, 0] > 0 > adv[1, 0]


def test_grpo_zero_outside_response_mask():
    adv = grpo_advantages(
        torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.tensor([[0, 1, 1, 0], [0, 0, 1, 0]])
    )
    assert adv[0, 0] == 0 and adv[0, 3] == 0 and adv[1, 1] == 0 and adv[1, 3] == 0
    assert adv[0, 1] > 0 and adv[1, 2] < 0


def test_grpo_follows_the_dtype_of_the_scores():
    scores = torch.tensor([1.0, 0.0], dtype=torch.float64)
    adv = grpo_advantages(
        scores, torch.tensor([0, 0]), torch.ones(2, 1, dtype=torch.float64), norm_by_std=False
    )
    assert adv.dtype == torch.float64
    assert adv.tolist() == [[0.5], [-0.5]]


def test_estimator_registry():
    assert ADVANTAGE_ESTIMATORS[AdvEstimator("grpo")].__name__ == "grpo"
    assert KL_ESTIMATORS[KLPenalty("low_var_kl")] is low_var_kl


# -------------------------------------------------------------------------------------- PPO clip


def ppo_case(ratios: list[float], advantages: list[float], mask: list[float] | None = None):
    """One row of tokens with old log-prob 0, so that ratio = exp(logp)."""
    logp = torch.log(torch.tensor([ratios])).requires_grad_(True)
    old = torch.zeros_like(logp)
    adv = torch.tensor([advantages])
    m = torch.tensor([mask if mask is not None else [1.0] * len(ratios)])
    out = ppo_clip_loss(logp, old, adv, m, CLIP_LOW, CLIP_HIGH)
    return logp, out


def test_ppo_clip_values_for_positive_and_negative_advantages():
    # clip range [1 - 0.2, 1 + 0.28] = [0.8, 1.28]; loss = max(-A r, -A clip(r))
    ratios = [1.5, 0.5, 1.25, 1.5, 0.5, 0.75, 0.85, 1.0]
    advs = [1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0, 2.0]
    _, out = ppo_case(ratios, advs)
    expected = [
        -1.28,  # A > 0, r above 1 + clip_high: clipped to 1.28
        -0.5,  # A > 0, r below 1 - clip_low: unclipped (pessimistic)
        -1.25,  # A > 0, r = 1.25 inside the asymmetric upper range (a symmetric 0.2 would clip it)
        1.5,  # A < 0, r above the range: unclipped
        0.8,  # A < 0, r below 1 - clip_low: clipped to 0.8
        0.8,  # A < 0, r = 0.75 < 0.8: clipped
        0.85,  # A < 0, r = 0.85 inside the range
        -2.0,  # r = 1
    ]
    close(out.loss, [expected])
    close(out.clipped, [[1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]])
    close(out.approx_kl, [[-math.log(r) for r in ratios]])
    assert not out.approx_kl.requires_grad


def test_ppo_clipfrac_is_token_mean_of_clipped():
    _, out = ppo_case([1.5, 0.5, 1.25, 0.5], [1.0, 1.0, 1.0, -1.0], mask=[1.0, 1.0, 1.0, 0.0])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    # token 3 would be clipped (A < 0, r = 0.5) but is masked out: 1 clipped token of 3
    assert out.clipped.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    assert token_mean(out.clipped, mask).item() == pytest.approx(1 / 3)


def test_ppo_masked_tokens_have_zero_loss_even_with_extreme_ratios():
    logp = torch.tensor([[0.0, 50.0]])
    out = ppo_clip_loss(
        logp, torch.zeros(1, 2), torch.tensor([[1.0, -3.0]]), torch.tensor([[1.0, 0.0]]), 0.2, 0.28
    )
    assert out.loss.tolist() == [[-1.0, 0.0]]
    assert out.approx_kl.tolist() == [[0.0, 0.0]]


def test_ppo_gradient_flows_only_through_unclipped_masked_in_tokens():
    ratios = [1.5, 0.5, 1.25, 1.5, 0.5, 0.85, 1.0, 1.0]
    advs = [1.0, 1.0, 1.0, -1.0, -1.0, -1.0, 1.0, 1.0]
    mask = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    logp, out = ppo_case(ratios, advs, mask)
    out.loss.sum().backward()
    # d(-A r)/d logp = -A r on unclipped tokens; 0 on clipped and masked ones
    close(logp.grad, [[0.0, -0.5, -1.25, 1.5, 0.0, 0.85, -1.0, 0.0]])


def test_ppo_gradient_with_old_logprobs_not_zero():
    # ratio = exp(logp - old) = exp(0.1); A = -2 -> loss = 2 r, gradient 2 r
    logp = torch.tensor([[-1.0]], requires_grad=True)
    old = torch.tensor([[-1.1]])
    out = ppo_clip_loss(logp, old, torch.tensor([[-2.0]]), torch.ones(1, 1), CLIP_LOW, CLIP_HIGH)
    out.loss.sum().backward()
    r = math.exp(0.1)
    assert out.loss.item() == pytest.approx(2 * r, abs=1e-6)
    assert logp.grad.item() == pytest.approx(2 * r, abs=1e-6)
    assert out.clipped.item() == 0.0


# -------------------------------------------------------------------------------------- token mean


def test_token_mean_default_and_explicit_normalizer():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert token_mean(values, mask).item() == pytest.approx(7 / 3)  # (1 + 2 + 4) / 3
    assert token_mean(values, mask, normalizer=10).item() == pytest.approx(0.7)
    assert token_mean(values, mask, normalizer=torch.tensor(14.0)).item() == pytest.approx(0.5)


def test_token_mean_empty_mask_is_zero_not_nan():
    assert token_mean(torch.ones(2, 2), torch.zeros(2, 2)).item() == 0.0


# ------------------------------------------------------------------------------------------- KL k3


def test_low_var_kl_values():
    logp = torch.zeros(1, 5)
    ref = torch.tensor([[math.log(2.0), math.log(0.5), 0.0, 5.0, -30.0]])
    # k3 = exp(d) - d - 1 with d = ref - logp
    # d = ln 2: 2 - 0.693147 - 1 = 0.306853;  d = ln 0.5: 0.5 + 0.693147 - 1 = 0.193147
    # d = 5: e^5 - 6 = 142.41 -> clamped to 10;  d = -30: 29 + e^-30 -> clamped to 10
    close(low_var_kl(logp, ref), [[0.306853, 0.193147, 0.0, 10.0, 10.0]])


def test_low_var_kl_gradient():
    # d k3 / d logp = -exp(d) + 1 with d = ref - logp; at d = ln 2 that is -1
    logp = torch.zeros(1, 2, requires_grad=True)
    ref = torch.tensor([[math.log(2.0), 0.0]])
    low_var_kl(logp, ref).sum().backward()
    close(logp.grad, [[-1.0, 0.0]])


def test_low_var_kl_is_never_negative():
    g = torch.Generator().manual_seed(0)
    logp, ref = torch.randn(4, 16, generator=g), torch.randn(4, 16, generator=g)
    assert (low_var_kl(logp, ref) >= 0).all()


# --------------------------------------------------------------------- micro-batch gradient parity


def test_micro_batches_with_the_mini_batch_normalizer_give_the_same_gradient():
    """Summing token-mean losses of 4 micro-batches (mini-batch normalizer) equals one big batch."""
    g = torch.Generator().manual_seed(0)
    B, T, V = 8, 6, 5
    logits0 = torch.randn(B, T, V, generator=g)
    labels = torch.randint(0, V, (B, T), generator=g)
    old = torch.log_softmax(logits0 + 0.3 * torch.randn(B, T, V, generator=g), -1).gather(
        -1, labels[..., None]
    )[..., 0]
    adv = torch.randn(B, 1, generator=g).expand(B, T)
    lengths = [1, 6, 2, 5, 3, 3, 6, 1]  # micro-batches hold different token counts
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lengths])

    def loss_of(logits, rows, normalizer):
        logp = torch.log_softmax(logits[rows], -1).gather(-1, labels[rows][..., None])[..., 0]
        out = ppo_clip_loss(logp, old[rows], adv[rows], mask[rows], CLIP_LOW, CLIP_HIGH)
        return token_mean(out.loss, mask[rows], normalizer)

    full = logits0.clone().requires_grad_(True)
    loss_of(full, slice(0, B), None).backward()

    micro = logits0.clone().requires_grad_(True)
    normalizer = mask.sum()
    for start in range(0, B, 2):
        loss_of(micro, slice(start, start + 2), normalizer).backward()
    torch.testing.assert_close(micro.grad, full.grad, atol=1e-6, rtol=1e-5)

    # the per-micro-batch default normalizer would weigh tokens differently: the check can fail
    wrong = logits0.clone().requires_grad_(True)
    for start in range(0, B, 2):
        (loss_of(wrong, slice(start, start + 2), None) / 4).backward()
    assert not torch.allclose(wrong.grad, full.grad, atol=1e-4)
