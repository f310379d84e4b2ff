"""The clipped value loss against hand-computed values, its gradient flow, and explained variance."""

from __future__ import annotations

import math

import pytest
import torch

from rlstack.algos.value_loss import clipped_value_loss, explained_variance


def test_clipped_value_loss_by_hand():
    # token 0: v moves 0.5 from v_old=0 (clip 0.2): err=(0.5-1)^2=0.25, clipped err=(0.2-1)^2=0.64 -> 0.32
    # token 1: v moves 0.1 (inside the clip range): both errors (0.1-0)^2=0.01 -> 0.005
    # token 2: masked
    values = torch.tensor([[0.5, 0.1, 3.0]])
    old = torch.tensor([[0.0, 0.0, 0.0]])
    returns = torch.tensor([[1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    out = clipped_value_loss(values, old, returns, mask, cliprange_value=0.2)
    assert out.loss[0].tolist() == pytest.approx([0.32, 0.005, 0.0])
    assert out.clipped.tolist() == [[1.0, 0.0, 0.0]]


def test_clipping_toward_the_return_keeps_the_unclipped_error():
    # v moved past the return: unclipped err (1.5-1)^2=0.25, clipped v=0.2 -> (0.2-1)^2=0.64 is larger
    # v moved away from the return: v=-0.5 -> err 2.25; clipped v=-0.2 -> 1.44: the unclipped is larger
    values = torch.tensor([[1.5, -0.5]], requires_grad=True)
    out = clipped_value_loss(values, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), 0.2)
    assert out.loss[0].tolist() == pytest.approx([0.32, 1.125])
    out.loss.sum().backward()
    # token 0: the clipped branch is constant in v -> no gradient; token 1: d/dv 0.5 (v-1)^2 = v-1 = -1.5
    assert values.grad[0].tolist() == pytest.approx([0.0, -1.5])


def test_masked_tokens_get_no_gradient():
    values = torch.tensor([[0.3, 0.7]], requires_grad=True)
    out = clipped_value_loss(values, values.detach(), torch.tensor([[1.0, 1.0]]), torch.tensor([[1, 0]]), 0.5)
    out.loss.sum().backward()
    assert values.grad[0, 1] == 0 and values.grad[0, 0] == pytest.approx(0.3 - 1.0)


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert float(explained_variance(returns.clone(), returns, mask)) == pytest.approx(1.0)
    # a constant critic at the mean explains nothing
    assert float(explained_variance(torch.full((1, 4), 2.0), returns, mask)) == pytest.approx(0.0)
    # V = [1, 1, 1]: residuals [0, 1, 2], var 2/3; returns var 2/3 -> 0
    assert float(explained_variance(torch.ones(1, 4), returns, mask)) == pytest.approx(0.0)
    assert math.isnan(float(explained_variance(torch.ones(1, 2), torch.ones(1, 2), torch.ones(1, 2))))


def test_non_finite_returns_on_padding_stay_out_of_the_loss_and_gradient():
    values = torch.tensor([[0.3, 0.7]], requires_grad=True)
    returns = torch.tensor([[1.0, math.nan]])
    out = clipped_value_loss(values, values.detach(), returns, torch.tensor([[1, 0]]), 0.5)
    out.loss.sum().backward()
    assert out.loss.tolist() == [[pytest.approx(0.245), 0.0]]
    assert values.grad.tolist() == [[pytest.approx(-0.7), 0.0]]
