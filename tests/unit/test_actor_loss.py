"""The actor's whole loss (algos/actor_loss.py) on small tensors: terms, masks, metrics, gradients."""

from __future__ import annotations

import math

import pytest
import torch

from rlstack.algos.actor_loss import ActorLossInputs, ActorLossParams, actor_loss
from rlstack.algos.kl import KLPenalty
from rlstack.algos.policy_loss import (
    LossAggMode,
    LossNormalizers,
    PolicyLoss,
    RolloutCorrection,
    RolloutCorrectionParams,
)
from rlstack.batch import token_budget_groups

SIX = {
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_higher",
    "actor/pg_clipfrac_lower",
    "actor/ppo_kl",
    "actor/entropy",
}


def inputs(**overrides) -> ActorLossInputs:
    """Two rows of three tokens, the last token of row 1 is padding; on-policy (old = current)."""
    logp = torch.tensor([[-0.5, -1.0, -2.0], [-0.2, -0.4, -3.0]], requires_grad=True)
    base = dict(
        logprobs=logp,
        entropy=torch.tensor([[1.0, 2.0, 0.5], [3.0, 0.1, 9.0]]),
        old_logprobs=logp.detach().clone(),
        advantages=torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]]),
        response_mask=torch.tensor([[1, 1, 1], [1, 1, 0]]),
    )
    return ActorLossInputs(**(base | overrides))


NORM = LossNormalizers(5, 2, 3)  # 5 sampled tokens, 2 sequences, max length 3


def test_plain_ppo_is_the_token_mean_policy_gradient_with_six_metrics():
    x = inputs()
    out = actor_loss(x, ActorLossParams(), NORM)
    # on-policy: loss = -A r with r = 1, token mean: (1 + 1 + 1 - 2 - 2) * -1 / 5 = 0.2
    assert out.loss.item() == pytest.approx(0.2)
    assert set(out.metrics) == SIX
    assert out.metrics["actor/entropy"].item() == pytest.approx((1 + 2 + 0.5 + 3 + 0.1) / 5)
    assert out.metrics["actor/ppo_kl"].item() == 0.0
    out.loss.backward()
    # d/d logp of -A r / 5 = -A / 5 on sampled tokens, 0 on padding
    torch.testing.assert_close(x.logprobs.grad, torch.tensor([[-0.2, -0.2, -0.2], [0.4, 0.4, 0.0]]))
    assert not any(m.requires_grad for m in out.metrics.values())


def test_pg_clipfrac_lower_counts_dual_clip_only_as_verl():
    # row 0: A > 0, r = 0.5 (unclipped), r = 2 (clipped high); row 1: A < 0, r = 0.5 (clipped low), r = 4 (dual)
    logp = torch.log(torch.tensor([[0.5, 2.0, 1.0], [0.5, 4.0, 1.0]]))
    x = inputs(logprobs=logp, old_logprobs=torch.zeros(2, 3))
    m = actor_loss(x, ActorLossParams(), NORM).metrics
    assert m["actor/pg_clipfrac_higher"].item() == pytest.approx(1 / 5)
    assert m["actor/pg_clipfrac"].item() == pytest.approx(2 / 5)  # upper + ordinary lower
    assert m["actor/pg_clipfrac_lower"].item() == pytest.approx(1 / 5)  # the dual-clipped token only


def test_rollout_correction_weighs_each_token_and_needs_the_rollout_logprobs():
    x = inputs(
        rollout_logprobs=inputs().old_logprobs + torch.log(torch.tensor([[2.0, 1.0, 0.5], [1.0, 1.0, 1.0]]))
    )
    params = ActorLossParams(
        rollout_correction=RolloutCorrection.TIS, rollout_correction_params=RolloutCorrectionParams(high=2.0)
    )
    out = actor_loss(x, params, NORM)
    # rho = exp(old - rollout) = 0.5, 1, 2, 1, 1: loss = -(0.5 + 1 + 2) + 2 (1 + 1) = 0.5, / 5
    assert out.loss.item() == pytest.approx(0.1)
    assert out.metrics["actor/rollout_correction_weight"].item() == pytest.approx((0.5 + 1 + 2 + 1 + 1) / 5)
    with pytest.raises(ValueError, match="rollout_logprobs"):
        actor_loss(inputs(), params, NORM)


def test_top_entropy_quantile_trains_only_the_high_entropy_tokens():
    x = inputs()
    actor_loss(x, ActorLossParams(top_entropy_quantile=0.4), NORM).loss.backward()
    # the 2 of 5 sampled tokens with the highest entropy: 3.0 (row 1) and 2.0 (row 0); padding's 9 never
    torch.testing.assert_close(x.logprobs.grad, torch.tensor([[0.0, -0.2, 0.0], [0.4, 0.0, 0.0]]))


def test_vppo_perception_mask_and_entropy_penalty():
    x = inputs(perception_mask=torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
    params = ActorLossParams(vppo_perception=True, vppo_entropy_penalty_coef=0.1)
    out = actor_loss(x, params, NORM)
    # policy term on the perception tokens: (-1 + 2) / 5 = 0.2; penalty 0.1 * mean(-logp) over 5 tokens
    penalty = 0.1 * (0.5 + 1.0 + 2.0 + 0.2 + 0.4) / 5
    assert out.metrics["actor/pg_loss"].item() == pytest.approx(0.2)
    assert out.metrics["actor/vppo_entropy_penalty"].item() == pytest.approx(penalty)
    assert out.loss.item() == pytest.approx(0.2 + penalty)
    out.loss.backward()
    torch.testing.assert_close(
        x.logprobs.grad, torch.tensor([[-0.2 - 0.02, -0.02, -0.02], [-0.02, 0.4 - 0.02, 0.0]])
    )
    with pytest.raises(ValueError, match="perception_mask"):
        actor_loss(inputs(), ActorLossParams(vppo_perception=True), NORM)


def test_entropy_bonus_is_subtracted_and_reaches_the_entropy():
    ent = torch.tensor([[1.0, 2.0, 0.5], [3.0, 0.1, 9.0]], requires_grad=True)
    out = actor_loss(inputs(entropy=ent), ActorLossParams(entropy_coeff=0.5), NORM)
    assert out.loss.item() == pytest.approx(0.2 - 0.5 * 6.6 / 5)
    out.loss.backward()
    torch.testing.assert_close(ent.grad, torch.tensor([[-0.1, -0.1, -0.1], [-0.1, -0.1, 0.0]]))


@pytest.mark.parametrize("kind", [k for k in KLPenalty if k != KLPenalty.FULL])
def test_kl_loss_from_reference_logprobs(kind):
    ref = inputs().old_logprobs - 0.3  # d = logp - ref = 0.3 on every token
    x = inputs(ref_logprobs=ref)
    out = actor_loss(x, ActorLossParams(kl_penalty=kind, kl_coef=0.1), NORM)
    per_token = {"kl": 0.3, "abs": 0.3, "mse": 0.045, "low_var_kl": math.exp(-0.3) + 0.3 - 1}[
        kind.value.rstrip("+")
    ]
    assert out.metrics["actor/kl_loss"].item() == pytest.approx(per_token)
    assert out.loss.item() == pytest.approx(0.2 + 0.1 * per_token)
    with pytest.raises(ValueError, match="ref_logprobs"):
        actor_loss(inputs(), ActorLossParams(kl_penalty=kind, kl_coef=0.1), NORM)


def test_exact_kl_loss_uses_the_given_per_token_kl():
    exact = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 100.0]], requires_grad=True)
    out = actor_loss(inputs(exact_kl=exact), ActorLossParams(kl_penalty=KLPenalty.FULL, kl_coef=1.0), NORM)
    assert out.metrics["actor/kl_loss"].item() == pytest.approx(1.5 / 5)
    out.loss.backward()
    torch.testing.assert_close(exact.grad, torch.tensor([[0.2, 0.2, 0.2], [0.2, 0.2, 0.0]]))
    with pytest.raises(ValueError, match="exact_kl"):
        actor_loss(inputs(), ActorLossParams(kl_penalty=KLPenalty.FULL, kl_coef=1.0), NORM)


@pytest.mark.parametrize("mode", list(LossAggMode))
@pytest.mark.parametrize("kind", [k for k in KLPenalty if k != KLPenalty.FULL])
def test_non_finite_values_on_padding_leave_loss_and_gradient_finite(kind, mode):
    """-inf reference and old log-probs and a NaN entropy on the padding token change nothing."""
    clean = inputs(ref_logprobs=inputs().old_logprobs - 0.3)
    dirty_ref = clean.ref_logprobs.clone()
    dirty_ref[1, 2] = -math.inf
    dirty_old = clean.old_logprobs.clone()
    dirty_old[1, 2] = -math.inf
    dirty_ent = clean.entropy.clone().requires_grad_(True)
    with torch.no_grad():
        dirty_ent[1, 2] = math.nan
    dirty = clean._replace(
        logprobs=clean.logprobs.detach().clone().requires_grad_(True),
        ref_logprobs=dirty_ref,
        old_logprobs=dirty_old,
        entropy=dirty_ent,
    )
    params = ActorLossParams(agg_mode=mode, entropy_coeff=0.01, kl_penalty=kind, kl_coef=0.1)
    a, b = actor_loss(clean, params, NORM), actor_loss(dirty, params, NORM)
    assert torch.isfinite(b.loss) and b.loss.item() == pytest.approx(a.loss.item())
    assert all(torch.isfinite(v) for v in b.metrics.values())
    a.loss.backward()
    b.loss.backward()
    torch.testing.assert_close(dirty.logprobs.grad, clean.logprobs.grad)
    assert torch.isfinite(dirty_ent.grad).all()


@pytest.mark.parametrize("loss_type", list(PolicyLoss))
def test_micro_batches_sum_to_the_mini_batch_with_every_term_on(loss_type):
    g = torch.Generator().manual_seed(0)
    B, T = 6, 4
    logp0 = -torch.rand(B, T, generator=g)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0]])
    base = dict(
        entropy=torch.rand(B, T, generator=g),
        old_logprobs=logp0 + 0.1 * torch.randn(B, T, generator=g),
        advantages=torch.randn(B, 1, generator=g).expand(B, T),
        response_mask=mask,
        rollout_logprobs=logp0 + 0.1 * torch.randn(B, T, generator=g),
        ref_logprobs=logp0 + 0.2 * torch.randn(B, T, generator=g),
    )
    params = ActorLossParams(
        loss_type=loss_type,
        agg_mode=LossAggMode.SEQ_MEAN_TOKEN_MEAN,
        rollout_correction=RolloutCorrection.ICEPOP,
        entropy_coeff=0.01,
        kl_penalty=KLPenalty.LOW_VAR_KL,
        kl_coef=0.1,
    )
    norm = LossNormalizers(mask.sum(), (mask.sum(-1) > 0).sum(), T)

    def run(parts: list[slice]) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        logp = logp0.clone().requires_grad_(True)
        total, metrics = torch.zeros(()), {}
        for rows in parts:
            x = ActorLossInputs(logprobs=logp[rows], **{k: v[rows] for k, v in base.items()})
            out = actor_loss(x, params, norm)
            out.loss.backward()
            total = total + out.loss.detach()
            for k, v in out.metrics.items():
                metrics[k] = metrics.get(k, 0.0) + v.item()
        return total, logp.grad, metrics

    whole, whole_grad, whole_metrics = run([slice(0, B)])
    # fixed row counts, and dynamic batches: groups of rows (not neighbours) cut by a token budget
    lengths = mask.sum(-1).tolist()
    budget_groups = token_budget_groups(lengths, budget=5)
    assert sorted(map(len, budget_groups)) == [1, 2, 3] and [0, 1] not in budget_groups
    for parts in ([slice(0, 2), slice(2, 3), slice(3, 6)], [torch.tensor(g) for g in budget_groups]):
        split, split_grad, split_metrics = run(parts)
        torch.testing.assert_close(split, whole)
        torch.testing.assert_close(split_grad, whole_grad)
        assert split_metrics == pytest.approx(whole_metrics)
    assert whole_grad.abs().sum() > 0


@pytest.mark.parametrize("loss_type", list(PolicyLoss))
@pytest.mark.parametrize("correction", [None, RolloutCorrection.TIS])
def test_a_row_of_zero_advantages_has_no_loss_and_no_gradient(loss_type, correction):
    """What worker.actor.skip_zero_advantage rests on: off-policy (ratios far from 1, clipped both ways and
    dual-clipped), under every policy loss, a row whose advantages are 0 adds exactly 0 to the loss and
    gets exactly 0 gradient, whatever the rows beside it."""
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(3, 5, generator=g) * 3).requires_grad_(True)
    advantages = torch.randn(3, 1, generator=g).expand(3, 5).clone()
    advantages[1] = 0.0
    x = inputs(
        logprobs=logp,
        entropy=torch.rand(3, 5, generator=g),
        old_logprobs=-torch.rand(3, 5, generator=g) * 3,
        advantages=advantages,
        response_mask=torch.ones(3, 5, dtype=torch.long),
        rollout_logprobs=-torch.rand(3, 5, generator=g) * 3,
    )
    params = ActorLossParams(loss_type=loss_type, rollout_correction=correction)
    norm = LossNormalizers(15, 3, 5)
    out = actor_loss(x, params, norm)
    out.loss.backward()
    assert logp.grad[1].eq(0).all() and logp.grad[[0, 2]].abs().sum() > 0
    alone = actor_loss(
        inputs(**{k: v[[0, 2]] for k, v in x._asdict().items() if v is not None}), params, norm
    )
    assert alone.loss.item() == pytest.approx(out.loss.item(), abs=1e-7)
