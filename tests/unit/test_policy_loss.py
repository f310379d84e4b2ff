"""Policy losses, loss aggregation and rollout correction against hand-computed values and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from rlstack.algos.policy_loss import (
    AGGREGATORS,
    POLICY_LOSSES,
    ROLLOUT_CORRECTIONS,
    LossAggMode,
    PolicyLoss,
    PolicyLossParams,
    RolloutCorrection,
    RolloutCorrectionParams,
    aggregate_loss,
    cispo_loss,
    gspo_loss,
    gspo_token_loss,
    policy_loss,
    ppo_clip_loss,
    rollout_correction,
    sapo_loss,
    token_mean,
    vanilla_loss,
)

PARAMS = PolicyLossParams()  # clip range [0.8, 1.28], dual clip c = 3, SAPO tau 1.0 / 1.05


def close(actual: torch.Tensor, expected: list, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def row(ratios: list[float]) -> torch.Tensor:
    """log-probs of one row whose old log-probs are 0, so that ratio = exp(logp); requires grad."""
    return torch.log(torch.tensor([ratios])).requires_grad_(True)


def run(kind: PolicyLoss, ratios: list[float], advantages: list[float], mask: list[float] | None = None):
    logp = row(ratios)
    m = torch.tensor([mask if mask is not None else [1.0] * len(ratios)])
    out = policy_loss(kind, logp, torch.zeros_like(logp), torch.tensor([advantages]), m, PARAMS)
    return logp, out


# ------------------------------------------------------------------------------------ PPO + dual clip


def test_vanilla_values_and_clip_flags():
    ratios = [1.5, 0.5, 1.25, 1.5, 0.5, 0.85, 4.0, 4.0, 2.0]
    advs = [1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0, 1.0, -2.0]
    _, out = run(PolicyLoss.VANILLA, ratios, advs)
    expected = [
        -1.28,  # A > 0, r above 1.28: clipped high
        -0.5,  # A > 0, r below 0.8: unclipped (pessimistic)
        -1.25,  # A > 0, r inside the asymmetric range
        1.5,  # A < 0, r = 1.5 < c = 3: unclipped, dual clip inactive
        0.8,  # A < 0, r below 0.8: clipped low
        0.85,  # A < 0, r inside the range
        3.0,  # A < 0, r = 4: -A r = 4 capped by dual clip at -A c = 3
        -1.28,  # A > 0, r = 4: clipped high; dual clip never applies to A > 0
        4.0,  # A = -2, r = 2: -A r = 4 < -A c = 6
    ]
    close(out.loss, [expected])
    close(out.clipped_high, [[1.0, 0, 0, 0, 0, 0, 0, 1.0, 0]])
    close(out.clipped_low, [[0, 0, 0, 0, 1.0, 0, 0, 0, 0]])
    # dual clip is counted on its own (veRL's pg_clipfrac_lower), not as lower clipping
    close(out.clipped_dual, [[0, 0, 0, 0, 0, 0, 1.0, 0, 0]])
    close(out.clipped, [[1.0, 0, 0, 0, 1.0, 0, 0, 1.0, 0]])
    close(out.approx_kl, [[-math.log(r) for r in ratios]])
    assert not out.approx_kl.requires_grad


def test_vanilla_gradient_only_on_unclipped_sampled_tokens():
    ratios = [1.5, 0.5, 1.25, 1.5, 0.5, 4.0, 2.0, 1.0]
    advs = [1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -2.0, 1.0]
    mask = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    logp, out = run(PolicyLoss.VANILLA, ratios, advs, mask)
    out.loss.sum().backward()
    # d(-A r)/d logp = -A r where unclipped; 0 where clipped high, clipped low, dual-clipped, or masked
    close(logp.grad, [[0.0, -0.5, -1.25, 1.5, 0.0, 0.0, 4.0, 0.0]])


def test_dual_clip_only_affects_negative_advantages_above_c():
    g = torch.Generator().manual_seed(0)
    logp = 1.5 * torch.randn(4, 64, generator=g)
    adv = torch.randn(4, 64, generator=g)
    mask = torch.ones(4, 64)
    old = torch.zeros_like(logp)
    dual = vanilla_loss(logp, old, adv, mask, PARAMS)
    plain = ppo_clip_loss(logp, old, adv, mask, PARAMS.clip_ratio_low, PARAMS.clip_ratio_high)
    hit = (adv < 0) & (logp.exp() > PARAMS.clip_ratio_dual)
    assert hit.sum() >= 5 and (~hit).sum() >= 100
    torch.testing.assert_close(dual.loss[~hit], plain.loss[~hit])
    torch.testing.assert_close(dual.loss[hit], -adv[hit] * PARAMS.clip_ratio_dual)
    assert (dual.loss[hit] < plain.loss[hit]).all()
    assert (dual.clipped_dual[hit] == 1).all() and (dual.clipped_dual[~hit] == 0).all()
    assert plain.clipped_dual.sum() == 0
    torch.testing.assert_close(dual.clipped_high, plain.clipped_high)
    torch.testing.assert_close(dual.clipped_low, plain.clipped_low)


def test_dual_clip_must_exceed_one():
    with pytest.raises(ValueError, match="clip_ratio_dual"):
        vanilla_loss(
            torch.zeros(1, 1),
            torch.zeros(1, 1),
            torch.ones(1, 1),
            torch.ones(1, 1),
            PARAMS._replace(clip_ratio_dual=1.0),
        )


def test_ppo_clip_loss_is_vanilla_without_dual_clip():
    logp = torch.log(torch.tensor([[4.0, 0.5, 1.5]]))
    adv = torch.tensor([[-1.0, -1.0, 1.0]])
    out = ppo_clip_loss(logp, torch.zeros_like(logp), adv, torch.ones(1, 3), 0.2, 0.28)
    close(out.loss, [[4.0, 0.8, -1.28]])
    close(out.clipped, [[0.0, 1.0, 1.0]])
    _, clipped_high, clipped_low, clipped_dual, _ = out  # the record's five fields, in order
    assert clipped_high.tolist() == [[0.0, 0.0, 1.0]] and clipped_low.tolist() == [[0.0, 1.0, 0.0]]
    assert clipped_dual.tolist() == [[0.0, 0.0, 0.0]]


# --------------------------------------------------------------------------------------------- GSPO


def gspo_case():
    # row 0: log-ratios 0.1, 0.3, -0.1 -> mean 0.1 -> s = e^0.1 = 1.105171, inside [0.8, 1.28], A = 1
    # row 1: log-ratios 0.5, 0.5 (third token masked, log-ratio 9) -> s = e^0.5 = 1.648721 > 1.28, A = 1
    # row 2: log-ratios -0.5 x 3 -> s = e^-0.5 = 0.606531 < 0.8, A = -1
    logp = torch.tensor([[0.1, 0.3, -0.1], [0.5, 0.5, 9.0], [-0.5, -0.5, -0.5]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    return logp, adv, mask


@pytest.mark.parametrize("kind", [PolicyLoss.GSPO, PolicyLoss.GSPO_TOKEN])
def test_gspo_values(kind):
    logp, adv, mask = gspo_case()
    out = policy_loss(kind, logp, torch.zeros_like(logp), adv, mask, PARAMS)
    s = 1.105171
    close(out.loss, [[-s, -s, -s], [-1.28, -1.28, 0.0], [0.8, 0.8, 0.8]])
    close(out.clipped_high, [[0, 0, 0], [1.0, 1.0, 0], [0, 0, 0]])
    close(out.clipped_low, [[0, 0, 0], [0, 0, 0], [1.0, 1.0, 1.0]])
    close(out.approx_kl, [[-0.1, -0.3, 0.1], [-0.5, -0.5, 0.0], [0.5, 0.5, 0.5]])


@pytest.mark.parametrize("kind", [PolicyLoss.GSPO, PolicyLoss.GSPO_TOKEN])
def test_gspo_gradient_is_the_sequence_objective_gradient(kind):
    logp, adv, mask = gspo_case()
    out = policy_loss(kind, logp, torch.zeros_like(logp), adv, mask, PARAMS)
    aggregate_loss(out.loss, mask, LossAggMode.SEQ_MEAN_TOKEN_MEAN, 8, 3, 3).backward()
    # row 0 unclipped: d/d logp_t of -A s_i / 3 (seq-mean over 3 rows) is -A s_i / |y_i| / 3
    #   = -1.105171 / 3 / 3 = -0.122797 for each token; clipped rows and the masked token: 0
    g = -0.122797
    close(logp.grad, [[g, g, g], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])

    # the paper's sequence objective, written directly on row 0, gives the same gradient
    direct = logp.detach()[:1].clone().requires_grad_(True)
    (-torch.exp(direct.mean()) / 3).backward()
    torch.testing.assert_close(direct.grad, logp.grad[:1])


@pytest.mark.parametrize("kind", [PolicyLoss.GSPO, PolicyLoss.GSPO_TOKEN])
def test_gspo_caps_the_sequence_log_ratio_at_10_as_verl(kind):
    """veRL clamps log s_i,t at 10 before exp: a sequence log-ratio of 12 gives -A e^10 and no gradient."""
    logp = torch.tensor([[12.0, 12.0], [0.1, 0.1]], requires_grad=True)
    adv = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    out = policy_loss(kind, logp, torch.zeros_like(logp), adv, torch.ones(2, 2), PARAMS)
    # row 0: unclipped branch -A s = e^10 wins over -A clip(s) = 1.28 (no dual clip in GSPO)
    torch.testing.assert_close(out.loss[0], torch.full((2,), math.exp(10.0)))
    out.loss.sum().backward()
    assert (logp.grad[0] == 0).all() and (logp.grad[1] != 0).all()


@pytest.mark.parametrize("kind", [PolicyLoss.GSPO, PolicyLoss.GSPO_TOKEN])
def test_gspo_averages_the_raw_token_log_ratios(kind):
    """log-ratios 30 and -28: veRL's mean is 1 (s = e); clamping each token to +-20 first would give -4."""
    logp = torch.tensor([[30.0, -28.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0]])
    params = PARAMS._replace(clip_ratio_high=5.0)  # keep s = e inside the clip range
    out = policy_loss(kind, logp, torch.zeros_like(logp), adv, torch.ones(1, 2), params)
    close(out.loss, [[-math.e, -math.e]])
    close(out.approx_kl, [[-20.0, 20.0]])  # the metric keeps the per-token clamp


def test_gspo_uses_the_sequence_advantage_gspo_token_the_token_one():
    logp = torch.full((1, 3), 0.1, requires_grad=True)  # s = e^0.1 = 1.105171
    adv = torch.tensor([[2.0, 0.0, -2.0]])  # mean 0
    mask = torch.ones(1, 3)
    seq = gspo_loss(logp, torch.zeros_like(logp), adv, mask, PARAMS)
    tok = gspo_token_loss(logp, torch.zeros_like(logp), adv, mask, PARAMS)
    close(seq.loss, [[0.0, 0.0, 0.0]])
    close(tok.loss, [[-2.210342, 0.0, 2.210342]])  # -A s per token


def test_gspo_and_gspo_token_agree_for_sequence_constant_advantages():
    g = torch.Generator().manual_seed(1)
    logp0 = 0.2 * torch.randn(4, 5, generator=g)
    old = logp0 + 0.1 * torch.randn(4, 5, generator=g)
    adv = torch.randn(4, 1, generator=g).expand(4, 5)
    mask = torch.tensor([[1.0] * n + [0.0] * (5 - n) for n in (5, 3, 1, 4)])
    grads = []
    for fn in (gspo_loss, gspo_token_loss):
        logp = logp0.clone().requires_grad_(True)
        out = fn(logp, old, adv * mask, mask, PARAMS)
        aggregate_loss(out.loss, mask, LossAggMode.SEQ_MEAN_TOKEN_MEAN, mask.sum(), 4, 5).backward()
        grads.append((out.loss.detach(), logp.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    torch.testing.assert_close(grads[0][1], grads[1][1])


# -------------------------------------------------------------------------------------------- CISPO


def test_cispo_values_and_every_sampled_token_keeps_gradient():
    ratios = [1.5, 0.5, 1.0, 2.0]
    advs = [1.0, -1.0, 2.0, 1.0]
    logp, out = run(PolicyLoss.CISPO, ratios, advs, mask=[1.0, 1.0, 1.0, 0.0])
    # loss = -A sg(min(r, 1.28)) logp
    #   r = 1.5: weight 1.28, -1.28 ln 1.5 = -0.518995
    #   r = 0.5: no lower bound, weight 0.5: -(-1) 0.5 ln 0.5 = -0.346574
    #   r = 1:   ln 1 = 0
    close(out.loss, [[-0.518995, -0.346574, 0.0, 0.0]])
    close(out.clipped_high, [[1.0, 0.0, 0.0, 0.0]])
    close(out.clipped_low, [[0.0, 0.0, 0.0, 0.0]])
    out.loss.sum().backward()
    # gradient -A w on every sampled token, the truncated one included (PPO would give it 0)
    close(logp.grad, [[-1.28, 0.5, -2.0, 0.0]])


# --------------------------------------------------------------------------------------------- SAPO


def test_sapo_values_and_gradient():
    ratios = [1.0, 1.0, 2.0, 0.5, 3.0]
    advs = [1.0, -1.0, 1.0, -1.0, -2.0]
    logp, out = run(PolicyLoss.SAPO, ratios, advs)
    # loss = -A sigmoid(tau (r - 1)) 4 / tau, tau = 1 for A > 0, 1.05 for A < 0
    #   r = 1:            sigmoid(0) = 0.5                 -> -1 * 2 = -2;   +1 * 2 / 1.05 = 1.904762
    #   r = 2, A = 1:     sigmoid(1) = 0.731059            -> -2.924234
    #   r = 0.5, A = -1:  sigmoid(-0.525) = 0.371684       -> 0.371684 * 4 / 1.05 = 1.415938
    #   r = 3, A = -2:    sigmoid(2.1) = 0.890903          -> 2 * 0.890903 * 4 / 1.05 = 6.787834
    close(out.loss, [[-2.0, 1.904762, -2.924234, 1.415938, 6.787834]])
    assert out.clipped.sum() == 0
    out.loss.sum().backward()
    # d/d logp = -A 4 sigmoid (1 - sigmoid) r: -A at r = 1 (as for -A r), smaller but never 0 away from it
    #   r = 2: -4 * 0.731059 * 0.268941 * 2 = -1.572895;  r = 0.5: 4 * 0.371684 * 0.628316 * 0.5 = 0.467070
    #   r = 3: 2 * 4 * 0.890903 * 0.109097 * 3 = 2.332673
    close(logp.grad, [[-1.0, 1.0, -1.572895, 0.467070, 2.332673]])


# ------------------------------------------------------------------------------------ every policy loss


def test_registry_covers_every_kind():
    assert set(POLICY_LOSSES) == set(PolicyLoss)
    assert POLICY_LOSSES[PolicyLoss("vanilla")] is vanilla_loss
    assert POLICY_LOSSES[PolicyLoss("cispo")] is cispo_loss and POLICY_LOSSES[PolicyLoss("sapo")] is sapo_loss


@pytest.mark.parametrize("kind", list(PolicyLoss))
def test_on_policy_gradient_is_the_policy_gradient(kind):
    """At logp = logp_old every loss has the REINFORCE gradient -A on each sampled token."""
    logp = torch.tensor([[-0.3, -1.2, -2.0, -0.7]], requires_grad=True)
    adv = torch.tensor([[1.5, 1.5, 1.5, 1.5]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    out = policy_loss(kind, logp, logp.detach().clone(), adv, mask, PARAMS)
    out.loss.sum().backward()
    close(logp.grad, [[-1.5, -1.5, -1.5, 0.0]])
    assert out.clipped.sum() == 0
    close(out.approx_kl, [[0.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize("kind", list(PolicyLoss))
def test_masked_tokens_have_zero_loss_and_no_gradient_even_with_garbage(kind):
    g = torch.Generator().manual_seed(2)
    logp = -torch.rand(3, 5, generator=g)
    old = logp + 0.1 * torch.randn(3, 5, generator=g)
    adv = torch.randn(3, 5, generator=g)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    logp[0, 3], logp[0, 4], logp[1, 1], old[1, 2] = 1e4, -math.inf, -1e4, -math.inf  # padding garbage
    logp.requires_grad_(True)
    out = policy_loss(kind, logp, old, adv, mask, PARAMS)
    out.loss.sum().backward()
    off = mask == 0
    assert torch.isfinite(out.loss).all() and torch.isfinite(logp.grad).all()
    assert (out.loss[off] == 0).all() and (logp.grad[off] == 0).all()
    assert (out.approx_kl[off] == 0).all() and (out.clipped[off] == 0).all()
    assert (logp.grad[~off] != 0).all()  # ratios near 1: no token is clipped
    assert not out.approx_kl.requires_grad


def test_log_ratio_is_clamped_so_huge_ratios_stay_finite():
    logp = torch.tensor([[200.0, -200.0]], requires_grad=True)
    for kind in PolicyLoss:
        out = policy_loss(
            kind, logp, torch.zeros(1, 2), torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2), PARAMS
        )
        out.loss.sum().backward()
        assert torch.isfinite(out.loss).all() and torch.isfinite(logp.grad).all(), kind
        close(out.approx_kl, [[-20.0, 20.0]])
        logp.grad = None


# -------------------------------------------------------------------------------------- aggregation


def test_aggregate_values():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # row 2 has no sampled token
    # 3 sampled tokens, 2 sequences with one, norm length 4
    expected = {
        LossAggMode.TOKEN_MEAN: 2.333333,  # (1 + 2 + 4) / 3
        LossAggMode.SEQ_MEAN_TOKEN_SUM: 3.5,  # (3 + 4) / 2
        LossAggMode.SEQ_MEAN_TOKEN_MEAN: 2.75,  # (1.5 + 4) / 2
        LossAggMode.SEQ_MEAN_TOKEN_SUM_NORM: 1.75,  # (3 + 4) / 4: veRL's sum over sequences / norm length
    }
    assert set(expected) == set(AGGREGATORS) == set(LossAggMode)
    for mode, value in expected.items():
        assert aggregate_loss(loss, mask, mode, 3, 2, 4).item() == pytest.approx(value, abs=1e-6), mode
    # the counts of a larger mini-batch this micro-batch belongs to: 7 tokens, 5 sequences
    assert aggregate_loss(loss, mask, LossAggMode.TOKEN_MEAN, 7, 5, 4).item() == pytest.approx(1.0)
    assert aggregate_loss(loss, mask, LossAggMode("seq-mean-token-sum"), 7, 5, 4).item() == pytest.approx(1.4)
    assert aggregate_loss(
        loss, mask, "seq-mean-token-mean", torch.tensor(7.0), torch.tensor(5), 4
    ).item() == (pytest.approx(1.1))
    # seq-mean-token-sum-norm divides by no count: the mini-batch's size does not change the share
    assert aggregate_loss(loss, mask, LossAggMode.SEQ_MEAN_TOKEN_SUM_NORM, 7, 5, 4).item() == pytest.approx(
        1.75
    )


@pytest.mark.parametrize("mode", list(LossAggMode))
def test_non_finite_values_outside_the_mask_do_not_reach_the_aggregate(mode):
    """A -inf or NaN on padding (reference log-prob, entropy) is selected away, not multiplied by 0."""
    values = torch.tensor([[1.0, 2.0, math.nan], [4.0, -math.inf, math.inf]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    clean = torch.tensor([[1.0, 2.0, 0.0], [4.0, 0.0, 0.0]], requires_grad=True)
    out = aggregate_loss(values, mask, mode, 3, 2, 3)
    out.backward()
    expected = aggregate_loss(clean, mask, mode, 3, 2, 3)
    expected.backward()
    assert torch.isfinite(out) and out.item() == pytest.approx(expected.item())
    torch.testing.assert_close(values.grad, clean.grad)
    assert token_mean(values, mask).item() == pytest.approx(7 / 3)


def test_aggregate_of_an_empty_micro_batch_is_zero_not_nan():
    for mode in LossAggMode:
        assert aggregate_loss(torch.ones(2, 3), torch.zeros(2, 3), mode, 0, 0, 3).item() == 0.0


def test_aggregate_rejects_a_non_positive_norm_length():
    with pytest.raises(ValueError, match="norm_length"):
        aggregate_loss(torch.ones(1, 1), torch.ones(1, 1), LossAggMode.TOKEN_MEAN, 1, 1, 0)


@pytest.mark.parametrize("mode", list(LossAggMode))
@pytest.mark.parametrize("kind", list(PolicyLoss))
def test_micro_batches_give_the_gradient_of_the_whole_mini_batch(kind, mode):
    """One micro-batch of 8 rows or four of 3, 1, 2, 2 rows: same loss and same gradient."""
    g = torch.Generator().manual_seed(3)
    B, T, V = 8, 6, 5
    logits0 = torch.randn(B, T, V, generator=g)
    labels = torch.randint(0, V, (B, T), generator=g)
    noisy = logits0 + 0.5 * torch.randn(B, T, V, generator=g)
    old = torch.log_softmax(noisy, -1).gather(-1, labels[..., None])[..., 0]
    adv = torch.randn(B, 1, generator=g).expand(B, T).clone()
    adv[1] += torch.randn(T, generator=g)  # one row with per-token advantages
    lengths = [1, 6, 0, 5, 3, 3, 6, 1]  # one row without sampled tokens
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lengths])
    tokens, seqs = mask.sum(), (mask.sum(-1) > 0).sum()

    def loss_of(logits: torch.Tensor, rows: slice) -> torch.Tensor:
        logp = torch.log_softmax(logits[rows], -1).gather(-1, labels[rows][..., None])[..., 0]
        out = policy_loss(kind, logp, old[rows], adv[rows], mask[rows], PARAMS)
        return aggregate_loss(out.loss, mask[rows], mode, tokens, seqs, T)

    full = logits0.clone().requires_grad_(True)
    whole = loss_of(full, slice(0, B))
    whole.backward()

    micro = logits0.clone().requires_grad_(True)
    total = torch.zeros(())
    for start, stop in [(0, 3), (3, 4), (4, 6), (6, 8)]:
        part = loss_of(micro, slice(start, stop))
        part.backward()
        total = total + part.detach()
    torch.testing.assert_close(total, whole.detach(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(micro.grad, full.grad, atol=1e-6, rtol=1e-5)
    assert full.grad.abs().sum() > 0


# ------------------------------------------------------------------------------- rollout correction


def weights(
    kind: RolloutCorrection, rhos: list[list[float]], mask: list[list[float]], params: RolloutCorrectionParams
):
    old = torch.log(torch.tensor(rhos)).requires_grad_(True)
    return rollout_correction(kind, old, torch.zeros_like(old), torch.tensor(mask), params)


def test_tis_truncates_token_ratios():
    w = weights(
        RolloutCorrection.TIS,
        [[0.4, 1.5, 3.0, 6.0]],
        [[1.0, 1.0, 1.0, 0.0]],
        RolloutCorrectionParams(high=2.0),
    )
    close(w, [[0.4, 1.5, 2.0, 0.0]])
    assert not w.requires_grad


def test_icepop_zeroes_token_ratios_outside_the_band():
    p = RolloutCorrectionParams(low=0.5, high=5.0)
    w = weights(RolloutCorrection.ICEPOP, [[0.4, 1.5, 3.0, 6.0, 1.0]], [[1.0, 1.0, 1.0, 1.0, 0.0]], p)
    close(w, [[0.0, 1.5, 3.0, 0.0, 0.0]])
    assert not w.requires_grad


def test_seq_mask_tis_weighs_whole_sequences_and_masks_those_outside_the_band():
    rhos = [
        [1.2, 1.5, 7.0],  # sampled 1.2 * 1.5 = 1.8, inside [0.5, 2]: weight 1.8 (the masked 7 is ignored)
        [2.0, 1.5, 1.0],  # 3.0 > 2: masked out
        [0.5, 0.8, 1.0],  # 0.4 < 0.5: masked out
        [0.9, 1.0, 1.0],  # 0.9: kept, its masked token still 0
    ]
    mask = [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]
    w = weights(RolloutCorrection.SEQ_MASK_TIS, rhos, mask, RolloutCorrectionParams(low=0.5, high=2.0))
    close(w, [[1.8, 1.8, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.9, 0.0, 0.0]])
    assert not w.requires_grad


def test_rollout_weight_scales_the_policy_gradient_per_token():
    logp = torch.zeros(1, 3, requires_grad=True)
    adv, mask = torch.ones(1, 3), torch.ones(1, 3)
    w = rollout_correction(
        "tis", torch.log(torch.tensor([[0.5, 1.0, 4.0]])), torch.zeros(1, 3), mask, RolloutCorrectionParams()
    )
    out = policy_loss(PolicyLoss.VANILLA, logp, logp.detach(), adv, mask, PARAMS)
    (out.loss * w).sum().backward()
    close(logp.grad, [[-0.5, -1.0, -2.0]])


def test_rollout_correction_registry_and_bounds():
    assert set(ROLLOUT_CORRECTIONS) == set(RolloutCorrection)
    with pytest.raises(ValueError, match="low <= high"):
        rollout_correction(
            "icepop",
            torch.zeros(1, 1),
            torch.zeros(1, 1),
            torch.ones(1, 1),
            RolloutCorrectionParams(3.0, 2.0),
        )
