"""The optimizer of low-precision weights: AdamW steps float32 master copies (mixed precision)."""

from __future__ import annotations

import pytest
import torch

from rlstack.config import OptimConfig
from rlstack.workers.training import BF16MomentsAdamW, MasterAdamW, MasterBF16MomentsAdamW, build_optimizer

START = float(torch.tensor(0.02, dtype=torch.bfloat16))
"""0.02 as bfloat16 holds it (0.0200195...)."""


def _steps(model: torch.nn.Module, n: int, lr: float = 1e-6) -> torch.optim.Optimizer:
    optimizer, _ = build_optimizer(model, OptimConfig(lr=lr, weight_decay=0.0), total_steps=n)
    for _ in range(n):
        model.weight.grad = torch.ones_like(model.weight)  # Adam's step is then lr per step
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return optimizer


def _layer(dtype: torch.dtype) -> torch.nn.Linear:
    layer = torch.nn.Linear(4, 4, bias=False)
    with torch.no_grad():
        layer.weight.fill_(0.02)
    return layer.to(dtype)


def test_bfloat16_weights_follow_updates_far_below_their_spacing():
    """200 steps of 1e-6 move a weight of 0.02 by 2e-4, while one step is far below bfloat16's spacing
    there (~1.2e-4): stepped directly, the weight would never move."""
    direct = _layer(torch.bfloat16)
    plain = torch.optim.AdamW(direct.parameters(), lr=1e-6, weight_decay=0.0)
    for _ in range(200):
        direct.weight.grad = torch.ones_like(direct.weight)
        plain.step()
    assert (direct.weight == torch.tensor(0.02, dtype=torch.bfloat16)).all()  # what this optimizer avoids

    layer = _layer(torch.bfloat16)
    optimizer = _steps(layer, 200)
    assert isinstance(optimizer, MasterAdamW) and layer.weight.grad is None
    (master,) = optimizer.masters
    assert master.dtype == torch.float32
    assert torch.allclose(master, torch.full_like(master, START - 200e-6), atol=1e-6)
    assert torch.equal(layer.weight, master.to(torch.bfloat16))  # the weights are the masters, rounded
    assert float(layer.weight.detach()[0, 0]) < START


def test_float32_weights_keep_the_plain_optimizer():
    optimizer = _steps(_layer(torch.float32), 3)
    assert type(optimizer) is torch.optim.AdamW


@pytest.mark.parametrize("with_masters", [True, False])
def test_a_resumed_optimizer_continues_from_the_saved_masters(with_masters):
    layer = _layer(torch.bfloat16)
    state = _steps(layer, 50).state_dict()
    assert len(state["master_weights"]) == 1
    resumed_layer = _layer(torch.bfloat16)
    with torch.no_grad():
        resumed_layer.weight.copy_(layer.weight)  # the checkpoint's (rounded) weights
    resumed, _ = build_optimizer(resumed_layer, OptimConfig(lr=1e-6, weight_decay=0.0), total_steps=50)
    if not with_masters:  # a state written without them: the masters start from the weights as loaded
        state = {k: v for k, v in state.items() if k != "master_weights"}
    resumed.load_state_dict(state)
    expected = START - 50e-6 if with_masters else float(layer.weight.detach()[0, 0])
    assert torch.allclose(resumed.masters[0], torch.full((4, 4), expected), atol=1e-6)
    if with_masters:  # the 50 steps that the rounded weights do not show are kept
        assert not torch.allclose(resumed.masters[0], torch.full((4, 4), START), atol=1e-5)


def test_the_masters_are_made_when_first_needed_so_a_policy_that_never_steps_holds_none():
    """`rlstack eval` and val-only runs build the policy's optimizer and never step it: no float32 copy of
    the weights (twice their bfloat16 memory) until a step, a save or a load."""
    layer = _layer(torch.bfloat16)
    optimizer, _ = build_optimizer(layer, OptimConfig(lr=1e-6, weight_decay=0.0), total_steps=1)
    assert isinstance(optimizer, MasterAdamW) and not optimizer.has_masters
    assert [p.dtype for p in optimizer.param_groups[0]["params"]] == [torch.bfloat16]
    state = optimizer.state_dict()  # a checkpoint before any step holds the masters
    assert optimizer.has_masters and state["master_weights"][0].dtype == torch.float32

    fresh, _ = build_optimizer(_layer(torch.bfloat16), OptimConfig(lr=1e-6, weight_decay=0.0), total_steps=1)
    fresh.load_state_dict(_steps(_layer(torch.bfloat16), 3).state_dict())  # a resume: state of the masters
    (master,) = fresh.masters
    assert fresh.state[master]["step"] == 3 and fresh.state[master]["exp_avg"].dtype == torch.float32


def _regression_steps(optimizer_of, steps: int) -> torch.Tensor:
    """`steps` of a least-squares fit from a fixed start: the fitted weight."""
    g = torch.Generator().manual_seed(0)
    x, w_true = torch.randn(64, 8, generator=g), torch.randn(8, 1, generator=g)
    layer = torch.nn.Linear(8, 1, bias=False)
    with torch.no_grad():
        layer.weight.zero_()
    optimizer = optimizer_of(layer)
    for _ in range(steps):
        ((layer(x) - x @ w_true) ** 2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return layer.weight.detach().clone()


def test_bfloat16_moments_follow_adamw_and_hold_half_its_state():
    """EasyR1's adamw_bf16: the moments kept in bfloat16, the step computed in float32, so that 100 steps
    of a fit land where float32 AdamW's do (to the moments' rounding), from 4 bytes of state a parameter."""
    config = OptimConfig(lr=1e-2, weight_decay=0.01, strategy="adamw_bf16")
    reference = _regression_steps(
        lambda m: build_optimizer(m, OptimConfig(lr=1e-2, weight_decay=0.01), 1)[0], 100
    )
    got = _regression_steps(lambda m: build_optimizer(m, config, 1)[0], 100)
    assert float(reference.abs().max()) > 0.5  # the fit moved far from its zero start
    torch.testing.assert_close(got, reference, atol=5e-3, rtol=0)

    layer = _layer(torch.float32)
    optimizer, _ = build_optimizer(layer, config, total_steps=1)
    assert type(optimizer) is BF16MomentsAdamW
    layer.weight.grad = torch.ones_like(layer.weight)
    optimizer.step()
    (state,) = optimizer.state.values()
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16


def test_bfloat16_weights_with_bfloat16_moments_resume_as_if_never_stopped():
    config = OptimConfig(lr=1e-6, weight_decay=0.0, strategy="adamw_bf16")

    def run(stop_at: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        layer = _layer(torch.bfloat16)
        optimizer, _ = build_optimizer(layer, config, total_steps=60)
        assert isinstance(optimizer, MasterBF16MomentsAdamW)
        for step in range(60):
            if step == stop_at:  # a checkpoint, and a fresh optimizer of the saved weights loading it
                state, weights = optimizer.state_dict(), layer.weight.detach().clone()
                layer = _layer(torch.bfloat16)
                with torch.no_grad():
                    layer.weight.copy_(weights)
                optimizer, _ = build_optimizer(layer, config, total_steps=60)
                optimizer.load_state_dict(state)
                (loaded,) = optimizer.state.values()
                assert loaded["exp_avg"].dtype == torch.bfloat16  # torch casts a loaded state to float32
            layer.weight.grad = torch.ones_like(layer.weight)
            optimizer.step()
            optimizer.zero_grad()
        return optimizer.masters[0].clone(), layer.weight.detach().clone()

    (master, weight), (resumed_master, resumed_weight) = run(None), run(30)
    assert torch.allclose(master, torch.full_like(master, START - 60e-6), atol=1e-6)  # the steps were kept
    assert torch.equal(master, resumed_master) and torch.equal(weight, resumed_weight)
