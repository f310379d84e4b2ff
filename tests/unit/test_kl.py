"""KL estimators, exact KL and the adaptive KL coefficient against hand-computed values and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from rlstack.algos.advantages import (
    AdvantageInputs,
    AdvantageParams,
    AdvEstimator,
    compute_advantages,
    outcome_token_rewards,
)
from rlstack.algos.kl import (
    KL_ESTIMATORS,
    KLPenalty,
    adaptive_kl_coef,
    kl_full,
    kl_in_reward,
    kl_penalty,
    low_var_kl,
)

LN2 = math.log(2.0)
SAMPLED = [k for k in KLPenalty if k is not KLPenalty.FULL]


def close(actual: torch.Tensor, expected: list, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# d = logp - ref with logp = 0 and ref = ln 2, ln 0.5, 0, 5, -30
REF = [LN2, -LN2, 0.0, 5.0, -30.0]
VALUES = {
    "kl": [-0.693147, 0.693147, 0.0, -5.0, 30.0],  # d
    "abs": [0.693147, 0.693147, 0.0, 5.0, 30.0],  # |d|
    "mse": [0.240227, 0.240227, 0.0, 12.5, 450.0],  # d^2 / 2
    # exp(-d) + d - 1: 2 - 0.693147 - 1, 0.5 + 0.693147 - 1, 0, e^5 - 6 -> 10, e^-20 + 19 -> 10 (clamped)
    "low_var_kl": [0.306853, 0.193147, 0.0, 10.0, 10.0],
}


@pytest.mark.parametrize("kind", SAMPLED)
def test_values(kind):
    # a `+` variant has the value of its estimator
    expected = VALUES[kind.value.rstrip("+")]
    close(kl_penalty(kind, torch.zeros(1, 5), torch.tensor([REF])), [expected], atol=1e-4)


# gradients with respect to logp = 0 at ref = ln 2, 0, -1 (d = -ln 2, 0, 1)
GRADS = {
    "kl": [1.0, 1.0, 1.0],  # d k1 / d logp = 1
    "abs": [-1.0, 0.0, 1.0],  # sign(d)
    "mse": [-0.693147, 0.0, 1.0],  # d
    "low_var_kl": [-1.0, 0.0, 0.632121],  # 1 - exp(-d): 1 - 2, 0, 1 - e^-1
    # k2's gradient for every `+` variant
    "kl+": [-0.693147, 0.0, 1.0],
    "abs+": [-0.693147, 0.0, 1.0],
    "mse+": [-0.693147, 0.0, 1.0],
    "low_var_kl+": [-0.693147, 0.0, 1.0],
}


@pytest.mark.parametrize("kind", SAMPLED)
def test_gradients(kind):
    logp = torch.zeros(1, 3, requires_grad=True)
    ref = torch.tensor([[LN2, 0.0, -1.0]], requires_grad=True)
    kl_penalty(kind, logp, ref).sum().backward()
    close(logp.grad, [GRADS[kind.value]])


def test_low_var_kl_gradient_stays_finite_for_huge_log_ratios():
    logp = torch.tensor([[-100.0, 100.0, 0.0]], requires_grad=True)
    for fn in (low_var_kl, KL_ESTIMATORS[KLPenalty.LOW_VAR_KL_PLUS]):
        value = fn(logp, torch.zeros(1, 3))
        value.sum().backward()
        assert torch.isfinite(logp.grad).all()
        close(value, [[10.0, 10.0, 0.0]])
        logp.grad = None
    low_var_kl(logp, torch.zeros(1, 3)).sum().backward()
    close(logp.grad, [[0.0, 0.0, 0.0]])  # beyond the clamp, no gradient


def test_registry_and_dispatch():
    assert set(KL_ESTIMATORS) == set(SAMPLED)
    assert KL_ESTIMATORS[KLPenalty("low_var_kl")] is low_var_kl
    logp, ref = torch.randn(2, 3), torch.randn(2, 3)
    for kind in SAMPLED:
        torch.testing.assert_close(kl_penalty(kind.value, logp, ref), KL_ESTIMATORS[kind](logp, ref))
    with pytest.raises(ValueError, match="kl_full"):
        kl_penalty(KLPenalty.FULL, logp, ref)


# ---------------------------------------------------------------------------------------- exact KL


def test_full_kl_values_and_gradient():
    # p = softmax(0, ln 3) = (0.25, 0.75), q = (0.5, 0.5)
    # KL = 0.25 ln 0.5 + 0.75 ln 1.5 = -0.173287 + 0.304099 = 0.130812
    logits = torch.tensor([[[0.0, math.log(3.0)], [1.0, -2.0]]], requires_grad=True)
    ref = torch.tensor([[[0.0, 0.0], [1.0, -2.0]]])
    kl = kl_full(logits, ref)
    close(kl, [[0.130812, 0.0]])
    kl.sum().backward()
    # d KL / d z_j = p_j (log p_j - log q_j - KL): 0.25 (ln 0.5 - 0.130812), 0.75 (ln 1.5 - 0.130812)
    close(logits.grad[0, 0], [-0.205990, 0.205990])
    close(logits.grad[0, 1], [0.0, 0.0])


def test_full_kl_matches_torch_distributions():
    g = torch.Generator().manual_seed(0)
    logits, ref = torch.randn(2, 3, 7, generator=g), torch.randn(2, 3, 7, generator=g)
    expected = torch.distributions.kl_divergence(
        torch.distributions.Categorical(logits=logits), torch.distributions.Categorical(logits=ref)
    )
    torch.testing.assert_close(kl_full(logits, ref), expected)
    assert (kl_full(logits, ref) >= 0).all()


def test_k1_and_k3_are_unbiased_and_plus_variants_have_the_kl_gradient_in_expectation():
    """Enumerating the vocabulary gives exact expectations over tokens sampled from p."""
    g = torch.Generator().manual_seed(1)
    z0, ref_logits = torch.randn(1, 1, 6, generator=g), torch.randn(1, 1, 6, generator=g)
    ref_logp = torch.log_softmax(ref_logits, -1)

    exact = z0.clone().requires_grad_(True)
    true_kl = kl_full(exact, ref_logits)
    true_kl.sum().backward()

    def expectation(kind: KLPenalty) -> tuple[torch.Tensor, torch.Tensor]:
        z = z0.clone().requires_grad_(True)
        logp = torch.log_softmax(z, -1)
        p = logp.exp().detach()  # the sampling distribution is not differentiated
        value = (p * kl_penalty(kind, logp, ref_logp)).sum()
        value.backward()
        return value.detach(), z.grad

    for kind in (KLPenalty.KL, KLPenalty.LOW_VAR_KL, KLPenalty.KL_PLUS, KLPenalty.LOW_VAR_KL_PLUS):
        value, _ = expectation(kind)
        torch.testing.assert_close(value, true_kl.detach().sum())
    for kind in (KLPenalty.MSE, KLPenalty.KL_PLUS, KLPenalty.ABS_PLUS, KLPenalty.LOW_VAR_KL_PLUS):
        _, grad = expectation(kind)
        torch.testing.assert_close(grad, exact.grad)
    _, k1_grad = expectation(KLPenalty.KL)  # E_p[grad log p] = 0: k1 as a loss pushes nothing
    torch.testing.assert_close(k1_grad, torch.zeros_like(k1_grad), atol=1e-6, rtol=0)


# --------------------------------------------------------------------------------- adaptive control


def test_adaptive_kl_coef_steps():
    # error = clip(KL / target - 1, -0.2, 0.2); coef * (1 + error * n_steps / horizon)
    # KL 0.15 vs 0.1: error 0.5 -> 0.2: 0.1 * (1 + 0.2 * 256 / 10000) = 0.100512
    assert adaptive_kl_coef(0.1, 0.15, 0.1, 10000, 256) == pytest.approx(0.100512)
    assert adaptive_kl_coef(0.1, 5.0, 0.1, 10000, 256) == pytest.approx(0.100512)  # clipped the same
    # KL 0.09 vs 0.1: error -0.1: 0.1 * (1 - 0.1 * 0.0256) = 0.099744
    assert adaptive_kl_coef(0.1, 0.09, 0.1, 10000, 256) == pytest.approx(0.099744)
    assert adaptive_kl_coef(0.1, 0.0, 0.1, 100, 100) == pytest.approx(0.08)  # error -0.2 at full gain
    assert adaptive_kl_coef(0.1, 0.1, 0.1, 10000, 256) == pytest.approx(0.1)


def test_adaptive_kl_coef_rejects_bad_target_or_horizon():
    with pytest.raises(ValueError, match="target"):
        adaptive_kl_coef(0.1, 0.1, 0.0, 10000, 1)
    with pytest.raises(ValueError, match="horizon"):
        adaptive_kl_coef(0.1, 0.1, 0.1, 0, 1)


# ------------------------------------------------------------------------------- in-reward KL


def reward_kl_case():
    """Two prompts x 2 responses, all scored 1; the KL (k1 = old - ref) differs between the responses."""
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    old = torch.zeros(4, 3)
    ref = torch.tensor(
        [[-0.1, -0.1, -math.inf], [0.0, 0.0, 0.0], [-1.0, -math.inf, -math.inf], [0.0, 0.0, 5.0]]
    )
    scores = torch.ones(4)
    return mask, old, ref, scores


def test_kl_in_reward_penalises_token_rewards_and_scores_alike():
    mask, old, ref, scores = reward_kl_case()
    out = kl_in_reward(outcome_token_rewards(scores, mask), scores, old, ref, mask, KLPenalty.KL, 0.5)
    # row KL sums 0.2, 0, 1, 0 (the -inf and 5 on padding are not read)
    close(out.scores, [0.9, 1.0, 0.5, 1.0])
    close(out.token_rewards, [[-0.05, 0.95, 0.0], [0.0, 0.0, 1.0], [0.5, 0.0, 0.0], [0.0, 1.0, 0.0]])
    torch.testing.assert_close(out.token_rewards.sum(-1), out.scores)
    assert out.mean_kl == pytest.approx((0.1 + 0.0 + 1.0 + 0.0) / 4)


@pytest.mark.parametrize("estimator", [e for e in AdvEstimator if e != AdvEstimator.GAE])
def test_in_reward_kl_reaches_the_advantages_of_every_estimator(estimator):
    """Equal scores give zero advantages; the in-reward KL must make them differ (veRL sums token rewards)."""
    mask, old, ref, scores = reward_kl_case()
    penalised = kl_in_reward(outcome_token_rewards(scores, mask), scores, old, ref, mask, KLPenalty.KL, 0.5)
    groups = torch.tensor([0, 0, 1, 1])
    inputs = AdvantageInputs(penalised.token_rewards, penalised.scores, groups, mask, baseline_scores=scores)
    adv, _ = compute_advantages(estimator, inputs, AdvantageParams())
    assert torch.isfinite(adv).all()
    assert adv.abs().sum() > 0, estimator
    if estimator == AdvEstimator.RLOO:  # r_i - mean of the others, on the penalised scores
        close(adv[:, 0], [-0.1, 0.1, -0.5, 0.5])
