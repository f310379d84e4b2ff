"""VPPO: visual dependency, perception mask, advantage shaping and entropy penalty, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlstack.algos.policy_loss import ppo_clip_loss, token_mean
from rlstack.algos.vppo import (
    advantage_shaping_scale,
    entropy_penalty,
    perception_token_mask,
    token_visual_dependency,
)

T, F = True, False


def close(actual: torch.Tensor, expected: list, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# ---------------------------------------------------------------------------------- dependency


def test_token_visual_dependency_k3_values_clamp_and_mask():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.01, 0.3, 0.4]]))
    masked = torch.log(torch.tensor([[0.25, 0.5, 0.9, 0.9, 0.4]]))
    mask = torch.tensor([[1, 1, 1, 0, 1]])
    # r = p_masked / p: 0.5 -> 0.5 + ln 2 - 1 = 0.193147; 2 -> 2 - ln 2 - 1 = 0.306853;
    # 90 -> 90 - ln 90 - 1 = 84.500190, clamped to 10; r = 3 is not sampled -> 0; r = 1 -> 0
    close(token_visual_dependency(logp, masked, mask, clamp_max=10.0), [[0.193147, 0.306853, 10.0, 0.0, 0.0]])
    close(token_visual_dependency(logp, masked, mask, clamp_max=100.0)[0, 2:3], [84.500190], atol=1e-3)


def test_token_visual_dependency_clamps_the_log_ratio_to_20():
    logp = torch.zeros(1, 2, dtype=torch.float64)
    masked = torch.tensor([[50.0, -50.0]], dtype=torch.float64)
    out = token_visual_dependency(logp, masked, torch.ones(1, 2), clamp_max=1e9)
    # x = 20: e^20 - 21 = 485165174.409790; x = -20: e^-20 + 19 = 19.000000002 (49 without the clamp)
    close(out, [[math.exp(20) - 21, 19.000000002]], atol=1e-6)
    assert out[0, 0].item() == pytest.approx(485165174.409790, abs=1e-4)


def test_token_visual_dependency_ignores_padding_values():
    logp = torch.tensor([[-1.0, float("-inf")]])
    masked = torch.tensor([[-1.0, float("-inf")]])
    out = token_visual_dependency(logp, masked, torch.tensor([[1, 0]]), clamp_max=10.0)
    assert out.tolist() == [[0.0, 0.0]]


# ------------------------------------------------------------------------------ perception mask

DEP = torch.tensor([[0.1, 0.5, 0.3, 0.9, 0.2], [0.4, 0.0, 0.7, 5.0, 5.0], [1.0, 1.0, 1.0, 1.0, 1.0]])
MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0]])


def test_perception_token_mask_is_top_p_per_trajectory():
    # row 0: n = 5, k = ceil(0.4 * 5) = 2 -> 0.9, 0.5; row 1: n = 3, k = ceil(1.2) = 2 -> 0.7, 0.4
    # (the 5.0s are not sampled); row 2 has no sampled token
    out = perception_token_mask(DEP, MASK, top_p=0.4)
    assert out.tolist() == [[F, T, F, T, F], [T, F, T, F, F], [F] * 5]
    assert perception_token_mask(DEP, MASK, top_p=1.0).tolist() == MASK.bool().tolist()


def test_perception_mask_gradient_reaches_only_perception_tokens():
    logp = torch.zeros(3, 5, requires_grad=True)
    mask = MASK.float()
    advantages = torch.tensor([[1.0], [-2.0], [3.0]]) * mask
    keep = perception_token_mask(DEP, MASK, top_p=0.4)
    out = ppo_clip_loss(logp, torch.zeros(3, 5), advantages, mask, 0.2, 0.28)
    token_mean(out.loss * keep, mask).backward()
    # ratio 1, unclipped: d loss / d logp = -A / 8 (8 sampled tokens) on kept tokens only
    close(logp.grad, [[0.0, -0.125, 0.0, -0.125, 0.0], [0.25, 0.0, 0.25, 0.0, 0.0], [0.0] * 5])


# --------------------------------------------------------------------------- advantage shaping


def test_advantage_shaping_scale_values():
    dep = torch.tensor([[0.2, 0.4, 0.0], [0.9, 0.1, 0.5], [0.1, 0.2, 7.0], [3.0, 3.0, 3.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [0, 0, 0]])
    # s = 0.3, 0.5, 0.1 (row 3 has no token: scale 1, left out); u = 0.5, 1, 0; mean u = 0.5
    # m = 0.9: 0.9 + u * 0.1 / 0.5 -> 1.0, 1.1, 0.9; m = 0.5: 0.5 + u -> 1.0, 1.5, 0.5
    close(advantage_shaping_scale(dep, mask, 0.9), [1.0, 1.1, 0.9, 1.0])
    close(advantage_shaping_scale(dep, mask, 0.5), [1.0, 1.5, 0.5, 1.0])
    assert advantage_shaping_scale(dep, mask, 0.9)[:3].mean().item() == pytest.approx(1.0)


def test_advantage_shaping_scale_is_one_without_spread():
    mask = torch.ones(2, 2)
    assert advantage_shaping_scale(torch.full((2, 2), 0.3), mask, 0.5).tolist() == [1.0, 1.0]
    one_row = torch.tensor([[1, 1], [0, 0]])
    assert advantage_shaping_scale(torch.tensor([[0.1, 0.9], [5.0, 5.0]]), one_row, 0.5).tolist() == [
        1.0,
        1.0,
    ]
    assert advantage_shaping_scale(torch.tensor([[0.1, 0.9], [5.0, 5.0]]), mask, 1.0).tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="scaling_min"):
        advantage_shaping_scale(torch.ones(2, 2), mask, 1.5)


def test_advantage_shaping_scale_carries_no_gradient():
    dep = torch.tensor([[0.2, 0.4], [0.1, 0.1]], requires_grad=True)
    mask = torch.ones(2, 2)
    scale = advantage_shaping_scale(dep, mask, 0.5)  # s = 0.3, 0.1 -> u = 1, 0, mean 0.5 -> 1.5, 0.5
    assert not scale.requires_grad
    close(scale, [1.5, 0.5])
    logp = torch.zeros(2, 2, requires_grad=True)
    advantages = torch.tensor([[1.0], [1.0]]) * scale[:, None] * mask
    out = ppo_clip_loss(logp, torch.zeros(2, 2), advantages, mask, 0.2, 0.28)
    token_mean(out.loss, mask).backward()
    close(logp.grad, [[-0.375, -0.375], [-0.125, -0.125]])  # -A * scale / 4
    assert dep.grad is None


# ----------------------------------------------------------------------------- entropy penalty


def test_entropy_penalty_values_and_gradient():
    logp = torch.tensor([[-0.5, -2.0, -1.0], [-0.1, -3.0, -4.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    per_token = entropy_penalty(logp, mask, coef=0.06)
    close(per_token, [[0.03, 0.12, 0.0], [0.006, 0.0, 0.0]], atol=1e-7)
    loss = token_mean(per_token, mask)  # 0.06 * (0.5 + 2 + 0.1) / 3 = 0.052
    assert loss.item() == pytest.approx(0.052, abs=1e-7)
    loss.backward()
    close(logp.grad, [[-0.02, -0.02, 0.0], [-0.02, 0.0, 0.0]], atol=1e-7)  # -coef / 3 on sampled tokens


def test_entropy_penalty_is_zero_on_padding_even_if_logprobs_are_not_finite():
    logp = torch.tensor([[-1.0, float("-inf")]], requires_grad=True)
    per_token = entropy_penalty(logp, torch.tensor([[1, 0]]), coef=0.5)
    assert per_token.tolist() == [[0.5, 0.0]]
    per_token.sum().backward()
    assert logp.grad.tolist() == [[-0.5, 0.0]]


# ------------------------------------------------------------- entropy tokens (use_vppo_on_entropy)


def _grad_of_actor_loss(**params) -> torch.Tensor:
    """d loss / d logp of actor_loss on DEP-shaped rows, the entropy column being DEP itself."""
    from rlstack.algos.actor_loss import ActorLossInputs, ActorLossParams, actor_loss
    from rlstack.algos.policy_loss import LossNormalizers

    logp = torch.zeros(3, 5, requires_grad=True)
    mask = MASK.float()
    perception = torch.tensor([[1.0, 0, 0, 0, 0], [0, 1.0, 0, 0, 0], [0.0] * 5])
    inputs = ActorLossInputs(
        logp, DEP, torch.zeros(3, 5), torch.tensor([[1.0], [-2.0], [3.0]]) * mask, mask, None, perception
    )
    norm = LossNormalizers(global_tokens=8.0, global_seqs=2.0, norm_length=5.0)
    actor_loss(inputs, ActorLossParams(**params), norm).loss.backward()
    return logp.grad


def test_vppo_entropy_tokens_get_the_gradient_alone_or_with_the_perception_tokens():
    # top_p 0.4 by entropy: row 0 keeps positions 3 and 1, row 1 positions 2 and 0 (as the perception
    # mask test above); -A / 8 on each kept token
    alone = [[0.0, -0.125, 0.0, -0.125, 0.0], [0.25, 0.0, 0.25, 0.0, 0.0], [0.0] * 5]
    close(_grad_of_actor_loss(vppo_entropy_top_p=0.4), alone)
    # OR'd with the perception mask (row 0 position 0, row 1 position 1), as VPPO's dp_actor does
    both = [[-0.125, -0.125, 0.0, -0.125, 0.0], [0.25, 0.25, 0.25, 0.0, 0.0], [0.0] * 5]
    close(_grad_of_actor_loss(vppo_entropy_top_p=0.4, vppo_perception=True), both)
    everything = [[-0.125] * 5, [0.25, 0.25, 0.25, 0.0, 0.0], [0.0] * 5]
    close(_grad_of_actor_loss(), everything)
